"""How fast is `cloudtrain offers` on a large imported catalog?

Generates a 50,000-row catalog in SkyPilot's vms.csv format (AWS, GCP with separately
priced GPUs, Azure and Lambda; GPU and CPU-only instance types over many regions and
zones), imports it with `cloudtrain catalog import-skypilot` into a temporary
CLOUDTRAIN_HOME, and times `cloudtrain offers --gpu A100 --sort price` as a user runs
it (a fresh process each time, output to a pipe). Also times a 50,000-row offers CSV
passed with `--catalog`. Same-run baselines: `cloudtrain --version` (CLI start-up)
and the same listing over the bundled catalog alone.

"warm" runs reuse the parsed-catalog cache that the first run (or the import) leaves
in CLOUDTRAIN_HOME/cache; "cold" runs delete it first and parse every CSV.

    python benchmarks/offers_listing.py [--rows 50000] [--repeat 5] [--out FILE]

Exits 1 if the median warm listing of the imported catalog takes more than 1.0 s.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_result
from cloudtrain.catalog.loader import OFFER_COLUMNS

LIMIT_S = 1.0
HEADER = [
    "InstanceType",
    "AcceleratorName",
    "AcceleratorCount",
    "vCPUs",
    "MemoryGiB",
    "GpuInfo",
    "Price",
    "SpotPrice",
    "Region",
    "AvailabilityZone",
]
LAMBDA_HEADER = [
    "InstanceType",
    "AcceleratorName",
    "AcceleratorCount",
    "vCPUs",
    "MemoryGiB",
    "Price",
    "Region",
    "GpuInfo",
    "SpotPrice",
]
# (accelerator, $/GPU-h on demand) per AWS family; None: CPU-only family.
AWS_FAMILIES = {
    "p3": ("V100", 3.06),
    "p3dn": ("V100-32GB", 3.90),
    "p4d": ("A100", 2.74),
    "p4de": ("A100-80GB", 3.43),
    "p5": ("H100", 6.88),
    "p5e": ("H200", 7.91),
    "g4dn": ("T4", 0.53),
    "g5": ("A10G", 1.01),
    "g6": ("L4", 0.80),
    "g6e": ("L40S", 1.86),
    "m6i": None,
    "c6i": None,
    "r6i": None,
    "m7g": None,
    "c7g": None,
    "t3": None,
}
SIZES = [("xlarge", 4, 1), ("2xlarge", 8, 1), ("4xlarge", 16, 1), ("8xlarge", 32, 1)]
SIZES += [("12xlarge", 48, 4), ("16xlarge", 64, 1), ("24xlarge", 96, 4), ("48xlarge", 192, 8)]
AREAS = ["us-east", "us-west", "eu-central", "eu-west", "ap-southeast", "ap-northeast", "sa-east"]
AREAS += ["ca-central", "me-south", "af-south", "ap-south", "eu-north"]


def gpu_info(name: str, count: int) -> str:
    return f"{{'Gpus': [{{'Name': '{name}', 'Manufacturer': 'NVIDIA', 'Count': {count}}}]}}"


def aws_rows(rng: random.Random, regions: int) -> list[list]:
    rows = []
    for area in AREAS:
        for n in range(1, regions + 1):
            region, zone_prefix = f"{area}-{n}", f"{area[:2]}{area.split('-')[1][:1]}{n}-az"
            uplift = 1 + 0.05 * rng.random()
            for family, gpu in AWS_FAMILIES.items():
                for size, vcpus, gpus in SIZES:
                    hourly = (gpu[1] * gpus if gpu else 0.048 * vcpus) * uplift
                    for z in range(1, 4):
                        spot = (
                            "" if rng.random() < 0.1 else round(hourly * rng.uniform(0.3, 0.7), 4)
                        )
                        accel = (gpu[0], gpus, gpu_info(gpu[0], gpus)) if gpu else ("", "", "")
                        rows.append(
                            [f"{family}.{size}", accel[0], accel[1], float(vcpus), vcpus * 4.0,
                             accel[2], round(hourly, 4), spot, region, f"{zone_prefix}{z}"]
                        )  # fmt: skip
    return rows


def gcp_rows(rng: random.Random, regions: int) -> list[list]:
    rows = []
    for area in ["us-central", "us-east", "europe-west", "asia-east", "asia-southeast"]:
        for n in range(1, regions + 1):
            region = f"{area}{n}"
            for zone in "abcf":
                z = f"{region}-{zone}"
                for cpus in (4, 8, 16, 32, 64, 96):
                    for kind, gib in (("standard", 3.75), ("highmem", 6.5)):
                        price = round(cpus * 0.0475 * (gib / 3.75) ** 0.3, 6)
                        rows.append([f"n1-{kind}-{cpus}", "", "", float(cpus), cpus * gib, "",
                                     price, round(price * 0.21, 6), region, z])  # fmt: skip
                for gpu, unit in (("T4", 0.35), ("V100", 2.48), ("P100", 1.46), ("L4", 0.56)):
                    for count in (1, 2, 4, 8):
                        rows.append(["", gpu, float(count), "", "", gpu, unit * count,
                                     round(unit * count * 0.3, 6), region, z])  # fmt: skip
                for count, name in ((1, "1g"), (2, "2g"), (4, "4g"), (8, "8g")):
                    rows.append([f"a2-highgpu-{name}", "A100", float(count), 12.0 * count,
                                 85.0 * count, "A100", round(3.673385 * count, 6),
                                 round(1.1 * count, 6), region, z])  # fmt: skip
    return rows


def azure_rows(rng: random.Random, regions: int) -> list[list]:
    sizes = [
        ("Standard_NC4as_T4_v3", "T4", 1, 4, 0.526),
        ("Standard_NC64as_T4_v3", "T4", 4, 64, 4.352),
    ]
    sizes += [("Standard_NC24ads_A100_v4", "A100-80GB", 1, 24, 3.673)]
    sizes += [
        ("Standard_ND96asr_v4", "A100", 8, 96, 27.197),
        ("Standard_NC6s_v3", "V100", 1, 6, 3.06),
    ]
    sizes += [
        ("Standard_NV6ads_A10_v5", "A10", 0.167, 6, 0.454),
        ("Standard_D4s_v5", "", "", 4, 0.192),
    ]
    rows = []
    for area in ["eastus", "westus", "northeurope", "westeurope", "japaneast", "southeastasia"]:
        for n in range(1, regions + 1):
            for name, gpu, count, cpus, price in sizes:
                spot = round(price * rng.uniform(0.1, 0.4), 4)
                rows.append(
                    [name, gpu, count, cpus, cpus * 7.0, gpu, price, spot, f"{area}{n}", ""]
                )
    return rows


def lambda_rows(regions: int) -> list[list]:
    types = [("gpu_1x_a100", "A100", 1, 30, 1.29), ("gpu_8x_a100", "A100", 8, 124, 10.32)]
    types += [("gpu_8x_h100_sxm5", "H100", 8, 208, 23.92), ("gpu_1x_a10", "A10", 1, 30, 0.75)]
    return [
        [name, gpu, float(count), float(cpus), cpus * 6.0, price, f"{area}-{n}",
         gpu_info(gpu, count), ""]
        for area in AREAS for n in range(1, regions + 1)
        for name, gpu, count, cpus, price in types
    ]  # fmt: skip


def write_skypilot_catalog(root: Path, rows: int, seed: int = 0) -> int:
    """Write `<root>/v7/<cloud>/vms.csv` for four clouds, `rows` rows in all."""
    rng = random.Random(seed)
    clouds = {
        "lambda": (LAMBDA_HEADER, lambda_rows(3)),
        "azure": ([*HEADER[:9], "Generation"], azure_rows(rng, 6)),
        "gcp": (HEADER, gcp_rows(rng, 6)),
    }
    left = rows - sum(len(r) for _, r in clouds.values())
    aws = aws_rows(rng, 10)
    if len(aws) < left:
        raise SystemExit(f"generator makes at most {len(aws) + rows - left} rows")
    clouds["aws"] = (HEADER, aws[:left])
    for cloud, (header, cloud_rows) in clouds.items():
        folder = root / "v7" / cloud
        folder.mkdir(parents=True)
        with (folder / "vms.csv").open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(header)
            writer.writerows(cloud_rows)
    return sum(len(r) for _, r in clouds.values())


def write_offers_csv(path: Path, rows: int, seed: int = 1) -> None:
    """A `rows`-row offers.csv in cloudtrain's own format (for `--catalog`)."""
    rng = random.Random(seed)
    gpus = ["A100", "A100-80GB", "H100", "T4", "L4", "V100", "A10G", "H200", "L40S"]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([column.name for column in OFFER_COLUMNS])
        for i in range(rows):
            count = rng.choice([1, 2, 4, 8])
            price = round(rng.uniform(0.3, 5.0) * count, 4)
            spot = round(price * 0.4, 4) if i % 3 else ""
            writer.writerow([f"cloud{i % 7}", f"region-{i % 97}", "", f"type-{i}",
                             rng.choice(gpus), count, 8 * count, 32 * count, "", "", "USD",
                             price, spot, "", "", "synthetic", "2026-01-01"])  # fmt: skip


def run(args: list[str], home: Path) -> float:
    env = {**os.environ, "CLOUDTRAIN_HOME": str(home), "COLUMNS": "100"}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "cloudtrain.cli", *args], env=env, capture_output=True, text=True
    )
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"cloudtrain {' '.join(args)} failed: {done.stderr.strip()}")
    return elapsed


def timed(args: list[str], home: Path, repeat: int, cold: bool = False) -> dict:
    """Median and spread of `repeat` runs; `cold` deletes the catalog cache before each."""
    times = []
    for _ in range(repeat):
        if cold:
            shutil.rmtree(home / "cache", ignore_errors=True)
        times.append(run(args, home))
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/)")
    options = parser.parse_args()
    listing = ["offers", "--gpu", "A100", "--sort", "price"]
    load_before = os.getloadavg()[0]  # other work on the machine inflates wall times
    with tempfile.TemporaryDirectory(prefix="cloudtrain-bench-") as tmp:
        root = Path(tmp)
        rows = write_skypilot_catalog(root / "sky", options.rows)
        bare, imported = root / "bare", root / "imported"
        start = time.perf_counter()
        run(["catalog", "import-skypilot", str(root / "sky")], imported)
        import_s = time.perf_counter() - start
        offer_rows = sum(
            sum(1 for line in p.open() if not line.startswith("#")) - 1
            for p in (imported / "catalog").glob("*.csv")
        )
        write_offers_csv(root / "offers_50k.csv", options.rows)
        direct = ["--catalog", str(root / "offers_50k.csv")]
        repeat = options.repeat
        results = {
            "version": timed(["--version"], bare, repeat),
            "listing_bundled": timed(listing, bare, repeat),
            "listing_imported_cold": timed(listing, imported, repeat, cold=True),
            "listing_imported_warm": timed(listing, imported, repeat),
            "listing_offers_csv_cold": timed([*listing, *direct], bare, repeat, cold=True),
            "listing_offers_csv_warm": timed([*listing, *direct], bare, repeat),
        }
    warm = results["listing_imported_warm"]["median_s"]
    payload = {
        "load_average_1m_before_after": [load_before, os.getloadavg()[0]],
        "skypilot_rows": rows,
        "imported_offer_rows": offer_rows,
        "offers_csv_rows": options.rows,
        "repeat": repeat,
        "import_wall_s": import_s,
        "wall_s": results,
        "ratio_imported_warm_to_version": warm / results["version"]["median_s"],
        "ratio_imported_warm_to_bundled": warm / results["listing_bundled"]["median_s"],
        "ratio_imported_cold_to_bundled": results["listing_imported_cold"]["median_s"]
        / results["listing_bundled"]["median_s"],
        "limit_s": LIMIT_S,
        "passed": warm <= LIMIT_S,
    }
    write_result("offers_listing", payload, options.out)
    if warm > LIMIT_S:
        print(f"FAIL: median listing {warm:.3f} s > {LIMIT_S} s", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
