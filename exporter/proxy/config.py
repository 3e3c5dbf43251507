"""The exporter's configuration: YAML validated by pydantic, refused whole when invalid."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from dashboards.mixin import CONFIG as MIXIN
from exporter.core.decode import DEFAULT_STALL_S

__all__ = ["Config", "ConfigError", "Engine", "Timeouts", "Slo", "Otlp", "Sessions", "Trace", "load_config",
           "parse_listen", "parse_gpu"]

RESERVED_SCENARIOS = frozenset({"none", "other"})
_NAME = r"^[a-z0-9_-]+$"
_GPU = re.compile(r"^(off|nvml|sim:[1-9][0-9]*)$")


class ConfigError(Exception):
    """An invalid configuration: the message names each field path and reason."""


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) to a (host, port) pair."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def parse_gpu(value: Any) -> str:
    """``off`` (YAML ``false`` too), ``nvml`` or ``sim:N``."""
    if value is False or value is None:
        return "off"
    text = str(value).strip().lower()
    if not _GPU.match(text):
        raise ValueError(f"expected 'off', 'nvml' or 'sim:N', got {value!r}")
    return text


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Engine(_Model):
    name: Annotated[str, Field(pattern=_NAME, max_length=64)]
    upstream: AnyHttpUrl
    #: ``inject`` adds ``stream_options.include_usage`` upstream for clients
    #: that do not ask for usage, and leaves the usage-only event out of their stream.
    usage: Literal["require", "inject"] = "require"
    #: ask the engine for each request's output token ids (vLLM ``return_token_ids``); they
    #: reach the raw capture, where ``evidence decode --tokenizer`` shows what was generated
    token_ids: bool = False

    @property
    def base_url(self) -> str:
        return str(self.upstream).rstrip("/")

    @property
    def display_url(self) -> str:
        """The upstream without any user:password part, for logs and messages."""
        u = self.upstream
        port = f":{u.port}" if u.port is not None else ""
        return f"{u.scheme}://{u.host}{port}{(u.path or '').rstrip('/')}"


class Timeouts(_Model):
    """Seconds.  Defaults allow a minutes-long prefill under load (the seed saw a 155 s TTFT)."""

    connect_s: Annotated[float, Field(gt=0)] = 10.0
    first_byte_s: Annotated[float, Field(gt=0)] = 900.0  # request sent -> first body byte
    idle_s: Annotated[float, Field(gt=0)] = 300.0  # longest gap between two body reads
    total_s: Annotated[float, Field(gt=0)] = 3600.0  # whole request


class Slo(_Model):
    """Service-level objective of one request; the seed's SLO is the default.

    The defaults come from the boards' mixin (:mod:`dashboards.mixin`), so the boards, the rules
    and the proxy draw one line."""

    ttft_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = MIXIN.slo_ttft_s
    tpot_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = MIXIN.slo_tpot_s


#: The default SLO, for code that has no config at hand.
DEFAULT_SLO = Slo()


class Otlp(_Model):
    """OTLP/HTTP export of the GenAI semantic-convention metrics (extra ``otel``)."""

    endpoint: AnyHttpUrl  # base URL; metrics go to {endpoint}/v1/metrics
    interval_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 10.0


class Sessions(_Model):
    """How long the proxy remembers a session to number its turns (records' ``turn``)."""

    #: a session idle for longer than this is forgotten: its next request is turn 1 again
    idle_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 600.0
    #: at most this many sessions held at once (the one idle longest goes first); ~300 bytes each
    max: Annotated[int, Field(ge=1)] = 100_000


class Trace(_Model):
    """Trace capture (extra ``trace``): each record keeps ``prefix_hashes``, keyed and chained hashes of
    its prompt's token blocks, for ``evidence trace`` (a Mooncake trace); no prompt text is kept."""

    #: the model's tokenizer: its directory (tokenizer.json, tokenizer_config.json with the chat
    #: template) or its tokenizer.json
    tokenizer: Path
    #: tokens per hashed block (AIPerf's default block size is 512)
    block_size: Annotated[int, Field(ge=1, le=1 << 20)] = 512

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer(cls, v: Path) -> Path:
        if not (v / "tokenizer.json" if v.is_dir() else v).is_file():
            raise ValueError(f"no tokenizer.json at {v}")
        return v


class Config(_Model):
    listen: str = "127.0.0.1:9464"
    engines: Annotated[list[Engine], Field(min_length=1)]
    scenarios: list[Annotated[str, Field(min_length=1, max_length=128)]] = []
    records_dir: Path = Path("./run")
    capture_raw_sse: Literal["failures", "all", "none"] = "failures"
    gpu: str = "off"
    gpu_interval_s: Annotated[float, Field(gt=0)] = 15.0
    timeouts: Timeouts = Timeouts()
    max_line_bytes: Annotated[int, Field(ge=1024)] = 16 << 20
    max_request_body_bytes: Annotated[int, Field(ge=1024)] = 64 << 20
    max_capture_bytes: Annotated[int, Field(ge=0)] = 64 << 20
    #: one SSE event (all its data lines) past this is ``malformed`` (memory per request bounded)
    max_event_bytes: Annotated[int, Field(ge=1024)] = 16 << 20
    slo: Slo = Slo()
    slo_by_scenario: dict[str, Slo] = {}
    otlp: Otlp | None = None
    sessions: Sessions = Sessions()
    trace: Trace | None = None  # off by default
    #: on SIGTERM: seconds for the requests in flight to finish, then at most this many more for
    #: two complete scrapes by each scraper seen in the last minute
    drain_timeout_s: Annotated[float, Field(ge=0)] = 30.0
    drain_scrape_timeout_s: Annotated[float, Field(ge=0)] = 15.0
    #: a raw gap between two visible-text arrivals over this (seconds) is a decode stall
    stall_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = DEFAULT_STALL_S
    #: the SHA-256 of the file this config was read from (:func:`load_config`; None otherwise)
    _source_sha256: str | None = PrivateAttr(default=None)

    @property
    def config_sha256(self) -> str | None:
        """The SHA-256 of the config file's bytes, as read (None when not read from a file)."""
        return self._source_sha256

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        parse_listen(v)
        return v

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu(cls, v: Any) -> str:
        return parse_gpu(v)

    @field_validator("scenarios")
    @classmethod
    def _scenarios(cls, v: list[str]) -> list[str]:
        clash = sorted(set(v) & RESERVED_SCENARIOS)
        if clash:
            raise ValueError(f"scenario names {clash} are reserved")
        if len(set(v)) != len(v):
            raise ValueError("scenario names must be unique")
        return v

    @model_validator(mode="after")
    def _unique_engines(self) -> Config:
        names = [e.name for e in self.engines]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"engine names must be unique, repeated: {dup}")
        return self

    def slo_for(self, scenario: str) -> Slo:
        """The SLO of a scenario label: its override, else the config's ``slo``."""
        return self.slo_by_scenario.get(scenario, self.slo)

    def engine(self, name: str) -> Engine | None:
        for e in self.engines:
            if e.name == name:
                return e
        return None


def _describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"  {path}: {err['msg']}")
    return "\n".join(lines)


def validate(data: Any, source: str = "config") -> Config:
    """Build a Config from parsed YAML, or raise ConfigError naming every bad field."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: invalid configuration\n{_describe(exc)}") from None


def load_config(path: str | Path, **overrides: Any) -> Config:
    """Read and validate a YAML file; ``overrides`` (e.g. listen, gpu) replace its keys."""
    p = Path(path)
    try:
        raw = p.read_bytes()
        text = raw.decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    if isinstance(data, dict):
        data.update({k: v for k, v in overrides.items() if v is not None})
    config = validate(data, str(p))
    config._source_sha256 = hashlib.sha256(raw).hexdigest()
    return config
