"""Compare the NVML GPU collector with nvidia-smi, idle and under a matrix-product load.

Run on a machine with an NVIDIA GPU (the project's check ran on an H200):

    python3 bench/gpu_compare.py --samples 5 --out gpu-compare.json

For each sample it reads every GPU through ``exporter.proxy.gpu.NvmlSource`` and through
``nvidia-smi --query-gpu=memory.used,clocks.sm,utilization.gpu,power.draw,temperature.gpu
--format=csv,noheader,nounits`` started at the same moment, then prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.proxy.gpu import NvmlSource  # noqa: E402

SMI_FIELDS = ["memory.used", "clocks.sm", "utilization.gpu", "power.draw", "temperature.gpu"]
OURS = ["DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_GPU_TEMP"]
# How close the two must be: memory and clocks exactly (nvidia-smi prints whole MiB and MHz);
# utilisation, power and temperature are sampled by the driver and move between two reads.
TOLERANCE = {"memory.used": 1.0, "clocks.sm": 0.0, "utilization.gpu": 10.0, "power.draw": 0.1, "temperature.gpu": 1.0}
RELATIVE = {"power.draw"}

LOAD = """
import time, torch
a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)
end = time.time() + {seconds}
while time.time() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
"""


def sample(source: NvmlSource) -> list[dict[str, Any]]:
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
                           stdout=subprocess.PIPE, text=True)
    readings, errors = source.read()
    out, _ = smi.communicate(timeout=30)
    rows = []
    for r, line in zip(readings, out.strip().splitlines()):
        smi_vals = [float(x) for x in line.split(",")]
        row = {"gpu": r.labels["gpu"], "model": r.labels["modelName"]}
        for field, ours, theirs in zip(SMI_FIELDS, OURS, smi_vals):
            mine = r.values.get(ours)
            diff = None if mine is None else mine - theirs
            limit = TOLERANCE[field] * (abs(theirs) if field in RELATIVE else 1.0)
            row[field] = {"collector": mine, "nvidia_smi": theirs, "diff": diff,
                          "ok": diff is not None and abs(diff) <= limit + 1e-9}
        rows.append(row)
    if errors:
        print("collector errors:", errors, file=sys.stderr)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--load-seconds", type=float, default=40)
    ap.add_argument("--out", default="gpu-compare.json")
    args = ap.parse_args()
    source = NvmlSource()
    result: dict[str, Any] = {"command": " ".join(sys.argv), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.strip()
    result["driver"] = driver
    result["idle"] = [sample(source) for _ in range(args.samples) if not time.sleep(1)]
    load = subprocess.Popen([sys.executable, "-c", LOAD.format(seconds=args.load_seconds)])
    time.sleep(8)  # allocation and clock ramp-up
    result["load"] = [sample(source) for _ in range(args.samples) if not time.sleep(1)]
    load.wait()
    source.close()
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"driver/GPU: {driver}")
    print("| phase | sample | GPU | field | collector | nvidia-smi | diff | within tolerance |")
    print("|---|---|---|---|---|---|---|---|")
    ok = True
    for phase in ("idle", "load"):
        for i, rows in enumerate(result[phase]):
            for row in rows:
                for field in SMI_FIELDS:
                    c = row[field]
                    ok &= c["ok"]
                    print(f"| {phase} | {i} | {row['gpu']} | {field} | {c['collector']:.3f} | {c['nvidia_smi']:g} "
                          f"| {c['diff']:+.3f} | {'yes' if c['ok'] else 'NO'} |")
    print("all within tolerance" if ok else "SOME READINGS DIFFER")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
