from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from exporter.proxy.config import ConfigError, load_config, validate

ROOT = Path(__file__).resolve().parents[2]


def test_example_config_is_valid() -> None:
    cfg = load_config(ROOT / "examples" / "stack.yaml")
    assert [e.name for e in cfg.engines] == ["sglang", "vllm"]
    assert cfg.gpu == "off"  # a bare YAML `off` reads as false
    assert cfg.timeouts.first_byte_s >= 600  # long prefills are legitimate
    # the quick start drives SGLang with its own bench client, which asks for no usage: without
    # inject every one of its requests would be a missing_usage failure
    assert {e.name: e.usage for e in cfg.engines} == {"sglang": "inject", "vllm": "require"}


def test_defaults() -> None:
    cfg = validate({"engines": [{"name": "a", "upstream": "http://127.0.0.1:1"}]})
    assert (cfg.listen, cfg.capture_raw_sse, cfg.gpu, cfg.max_request_body_bytes) == (
        "127.0.0.1:9464", "failures", "off", 64 << 20)


@pytest.mark.parametrize("data, path, words", [
    ({"engines": [{"name": "Bad Name", "upstream": "http://x"}]}, "engines.0.name", "pattern"),
    ({"engines": [{"name": "a", "upstream": "ftp://x"}]}, "engines.0.upstream", "scheme"),
    ({"engines": []}, "engines", "at least 1"),
    ({}, "engines", "required"),
    ({"engines": [{"name": "a", "upstream": "http://x"}], "capture_raw_sse": "some"}, "capture_raw_sse", "failures"),
    ({"engines": [{"name": "a", "upstream": "http://x"}], "gpu": "cuda"}, "gpu", "sim:N"),
    ({"engines": [{"name": "a", "upstream": "http://x"}], "listen": "nohost"}, "listen", "HOST:PORT"),
    ({"engines": [{"name": "a", "upstream": "http://x"}], "timeouts": {"idle_s": 0}}, "timeouts.idle_s", "greater than 0"),
    ({"engines": [{"name": "a", "upstream": "http://x"}], "scenarios": ["other"]}, "scenarios", "reserved"),
    ({"engines": [{"name": "a", "upstream": "http://x"}, {"name": "a", "upstream": "http://y"}]}, "(top level)", "unique"),
    ({"engines": [{"name": "a", "upstream": "http://x"}], "typo_key": 1}, "typo_key", "not permitted"),
])
def test_invalid_config_names_field_and_reason(data: dict, path: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate(data)
    assert f"  {path}: " in str(err.value) and words in str(err.value)


def test_gpu_values() -> None:
    base = {"engines": [{"name": "a", "upstream": "http://x"}]}
    assert validate({**base, "gpu": False}).gpu == "off"
    assert validate({**base, "gpu": "sim:8"}).gpu == "sim:8"
    assert validate({**base, "gpu": "nvml"}).gpu == "nvml"


@pytest.mark.slow  # a subprocess or a whole-tree tool: runs in the full suite
def test_serve_refuses_invalid_file_with_status_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("engines:\n  - name: vllm\n    upstream: not-a-url\n")
    proc = subprocess.run([sys.executable, "-m", "exporter.cli", "serve", "--config", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "engines.0.upstream" in proc.stderr and "Traceback" not in proc.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("engines: [\n")
    proc = subprocess.run([sys.executable, "-m", "exporter.cli", "serve", "--config", str(broken)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not valid YAML" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "exporter.cli", "serve", "--config", str(tmp_path / "none.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "cannot read" in proc.stderr


def test_credentials_in_upstream_are_not_displayed() -> None:
    cfg = validate({"engines": [{"name": "a", "upstream": "http://user:s3cret@10.0.0.1:8000/"}]})
    assert cfg.engines[0].display_url == "http://10.0.0.1:8000"
    assert "s3cret" in cfg.engines[0].base_url  # still used for the upstream itself


@pytest.mark.slow  # a subprocess: runs in the full suite
def test_serve_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"listen: 127.0.0.1:{port}\nrecords_dir: {tmp_path / 'run'}\n"
                       "engines:\n  - {name: vllm, upstream: 'http://127.0.0.1:1'}\n")
        proc = subprocess.run([sys.executable, "-m", "exporter.cli", "serve", "--config", str(cfg)],
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr
