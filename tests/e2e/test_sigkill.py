"""A SIGKILL of the proxy under load leaves no torn record line."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import yaml

from exporter.harness.load import Cell, Driver, Plan, Stage
from exporter.harness.stack import Child, exporter_argv, free_port, wait_http

KILL_AFTER = 100  # records on disk before the kill


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def test_sigkill_leaves_no_torn_record(tmp_path: Path) -> None:
    ports = {n: free_port() for n in ("sim", "proxy")}  # sim and serve refuse port 0 and name no bound port
    children = [Child("sim", exporter_argv("sim", "--profile", "vllm", "--listen", f"127.0.0.1:{ports['sim']}",
                                            "--speed", "20", "--fault-disconnect", "0.05"), tmp_path)]
    cfg = tmp_path / "stack.yaml"
    cfg.write_text(yaml.safe_dump({"listen": f"127.0.0.1:{ports['proxy']}", "records_dir": str(tmp_path / "run"),
                                   "engines": [{"name": "vllm", "upstream": f"http://127.0.0.1:{ports['sim']}"}]}))
    proxy = Child("proxy", exporter_argv("serve", "--config", str(cfg)), tmp_path)
    children.append(proxy)
    try:
        wait_http(f"http://127.0.0.1:{ports['sim']}/health", 30, children[0])
        wait_http(f"http://127.0.0.1:{ports['proxy']}/-/ready", 30, proxy)

        async def drive() -> None:
            async with Driver(f"http://127.0.0.1:{ports['proxy']}/vllm", tmp_path / "load", model="m") as d:
                plan = Plan([Stage("s", [Cell("soak", 16, 16, requests=100_000, concurrency=32)])])
                task = asyncio.create_task(d.run_plan(plan))
                async with asyncio.timeout(120):  # only against a hang: the kill follows a count, not a time
                    while _lines(tmp_path / "run" / "requests.jsonl") <= KILL_AFTER:
                        if task.done():
                            task.result()  # the load stopped early: its error, not a hang
                        await asyncio.sleep(0.05)
                proxy.proc.send_signal(signal.SIGKILL)  # mid-flight: dozens of requests open
                await asyncio.sleep(0.2)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

        asyncio.run(drive())
    finally:
        for c in reversed(children):
            c.stop()
    lines = (tmp_path / "run" / "requests.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b""  # the file ends with a complete line
    records = [json.loads(x) for x in lines[:-1]]
    assert len(records) > KILL_AFTER  # every line written before the kill is whole
    client = [json.loads(x) for x in (tmp_path / "load" / "requests.jsonl").read_text().splitlines()]
    by_id = {r["client_request_id"]: r for r in records}
    done = [c for c in client if c["proxy_id"] and c["id"] in by_id]
    # every request the client saw finish before the kill has its record, with the same verdict
    assert done and all(by_id[c["id"]]["outcome"] == c["outcome"] for c in done if c["outcome"] == "success")
