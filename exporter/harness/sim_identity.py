"""What a simulated engine says it is, on the routes the real engine answers.

* ``--profile vllm``: ``GET /version`` (``{"version": ...}``), ``GET /v1/models`` (``id``,
  ``root``, ``max_model_len``) and, as vLLM does when started with ``VLLM_SERVER_DEV_MODE=1``,
  ``GET /server_info`` with its config (``{"vllm_config": {...}}``);
* ``--profile sglang``: ``GET /server_info`` and the older ``/get_server_info`` (every server
  argument, the scheduler's figures, ``internal_states`` and ``version``), ``GET /model_info``
  (``/get_model_info``), ``GET /v1/models`` and ``GET /ready`` (SGLang's readiness, which the
  proxy probes once it knows the engine is SGLang).

The version is ``sim-`` and this package's version, so that a report never passes a simulator
off as the engine itself; the arguments are the real engine's names for what the simulator
models, and every simulator parameter under ``sim_params``.  The SGLang profile's ``api_key``
and ``admin_api_key`` are there (null), as a real server reports them.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from aiohttp import web

from exporter import __version__

from .sim_engine import SimParams

__all__ = ["add_identity_routes", "sim_version", "MAX_MODEL_LEN", "model_root"]

MAX_MODEL_LEN = 32768


def sim_version() -> str:
    return f"sim-{__version__}"


def model_root(params: SimParams) -> str:
    """Where the simulated model would live (the ``root`` of ``/v1/models``)."""
    return f"/models/sim/{params.model}"


def _models(params: SimParams) -> dict[str, Any]:
    return {"object": "list", "data": [
        {"id": params.model, "object": "model", "created": int(time.time()), "owned_by": params.profile,
         "root": model_root(params), "parent": None, "max_model_len": MAX_MODEL_LEN}]}


def _vllm_config(params: SimParams) -> dict[str, Any]:
    return {"vllm_config": {
        "model_config": {"model": model_root(params), "served_model_name": params.model, "max_model_len": MAX_MODEL_LEN,
                         "dtype": "simulated"},
        "parallel_config": {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "data_parallel_size": 1},
        "scheduler_config": {"max_num_seqs": params.max_running},
        "sim_params": dataclasses.asdict(params),
    }}


def _sglang_server_info(params: SimParams) -> dict[str, Any]:
    return {
        "model_path": model_root(params), "tokenizer_path": model_root(params), "served_model_name": params.model,
        "context_length": MAX_MODEL_LEN, "tp_size": 1, "dp_size": 1, "pp_size": 1, "ep_size": 1,
        "max_running_requests": params.max_running, "api_key": None, "admin_api_key": None,
        "max_total_num_tokens": params.kv_capacity_tokens, "sim_params": dataclasses.asdict(params),
        "internal_states": [{"last_gen_throughput": 0.0}], "version": sim_version(),
    }


def _sglang_model_info(params: SimParams) -> dict[str, Any]:
    return {"model_path": model_root(params), "tokenizer_path": model_root(params), "is_generation": True,
            "preferred_sampling_params": None, "weight_version": "default", "has_image_understanding": False,
            "has_audio_understanding": False}


def _json(make: Any, params: SimParams) -> Any:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response(make(params))
    return handler


def add_identity_routes(app: web.Application, params: SimParams) -> None:
    """The identity routes of ``params.profile`` (``/v1/models`` for both)."""
    app.router.add_get("/v1/models", _json(_models, params))
    if params.profile == "vllm":
        app.router.add_get("/version", _json(lambda p: {"version": sim_version()}, params))
        app.router.add_get("/server_info", _json(_vllm_config, params))
        return
    for path in ("/server_info", "/get_server_info"):
        app.router.add_get(path, _json(_sglang_server_info, params))
    for path in ("/model_info", "/get_model_info"):
        app.router.add_get(path, _json(_sglang_model_info, params))
    app.router.add_get("/ready", _ready)  # SGLang's readiness (its /health generates a token)


async def _ready(request: web.Request) -> web.Response:
    return web.Response(status=200)
