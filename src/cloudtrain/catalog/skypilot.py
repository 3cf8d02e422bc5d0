"""Import SkyPilot's catalog CSVs (`~/.sky/catalogs/<version>/<cloud>/vms.csv`) as offers.

SkyPilot keeps one `vms.csv` per cloud with the columns `InstanceType,
AcceleratorName, AcceleratorCount, vCPUs, MemoryGiB, GpuInfo, Price, SpotPrice,
Region, AvailabilityZone`, in an order (and subset) that differs between clouds; one
row per instance type and zone (or region). How rows become offers:

- rows without an accelerator are skipped; so are fractional accelerator counts
  (Azure's partial-GPU sizes), accelerators no catalog GPU is named after, and rows
  without an on-demand price or without vCPU/memory figures, each counted by reason;
- an empty `SpotPrice` means no spot market;
- GCP prices GPUs apart from the host VM: a row with an accelerator and no instance
  type is the price of that many GPUs in a zone, attached to an N1 host with 8 vCPUs
  per GPU in the same zone (n1-standard-*, else n1-highmem-*); the offer is named
  like 'n1-standard-8+1xV100' and costs host plus GPUs (spot only when both have a
  spot price). Only T4, V100, P100, P4 and K80 attach to N1; a2/a3/g2 machine types
  come with their GPUs and have the full price in their row;
- SkyPilot's accelerator names are coarse ('A100-80GB' for Azure's PCIe card, 'A100'
  for Lambda's PCIe gpu_1x_a100): where the catalog already lists the same provider
  and instance type with as many GPUs of a model whose name starts with SkyPilot's
  name, that model is used (counted as `gpus_refined`); else an instance type
  containing 'pcie' takes the '<name> PCIe' GPU if there is one;
- zones collapse to one offer per (cloud, region, instance type) with the lowest
  on-demand and the lowest spot price across them (zone kept only if there was one).

Offers are written to `$CLOUDTRAIN_HOME/catalog/skypilot_<cloud>_offers.csv` in
the offers.csv format, where `load_catalog` merges them over the bundled rows; the
provider is SkyPilot's cloud name (aws, gcp, azure, lambda, runpod, ...), the names
the bundled offers use too.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import os
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cloudtrain import paths
from cloudtrain.catalog.loader import OFFER_COLUMNS, load_catalog
from cloudtrain.catalog.names import gpu_index, normalize_gpu_name
from cloudtrain.catalog.types import Catalog, GPUSpec
from cloudtrain.errors import DataError, UserError

DEFAULT_ROOT = Path("~/.sky/catalogs")
REQUIRED = ("InstanceType", "AcceleratorName", "AcceleratorCount", "Price", "Region")
OPTIONAL = ("vCPUs", "MemoryGiB", "SpotPrice", "AvailabilityZone")
N1_ATTACHABLE = frozenset({"t4", "v100", "p100", "p4", "k80"})
"""Normalised names of the GPUs GCP attaches to N1 hosts."""

SKIP_NO_ACCELERATOR = "no accelerator"
SKIP_FRACTIONAL = "fractional accelerator count"
SKIP_UNKNOWN = "unknown accelerator"
SKIP_NO_PRICE = "no on-demand price"
SKIP_NO_SIZE = "no vCPU/memory figures"
SKIP_NO_HOST = "GCP GPU price without an N1 host in its zone"
SKIP_NOT_ATTACHABLE = "GCP GPU price for a GPU that comes with its own machine type"


@dataclass(frozen=True)
class CloudImport:
    """What importing one cloud's vms.csv did."""

    cloud: str
    provider: str
    source_file: str
    output_file: str
    rows_read: int
    offers_written: int
    skipped: dict[str, int]
    """Reason -> number of rows skipped for it."""
    unknown_accelerators: dict[str, int]
    """Accelerator names no catalog GPU is called -> rows (add an alias to use them)."""
    gpus_refined: int
    """Offers whose GPU model came from the catalog's row for the same instance type."""


@dataclass(frozen=True)
class ImportResult:
    """Totals over every imported cloud, and each cloud's detail."""

    clouds: tuple[CloudImport, ...]
    rows_read: int
    offers_written: dict[str, int]
    skipped: dict[str, int]
    unknown_accelerators: dict[str, int]


@dataclass
class _Best:
    """Cheapest prices of one (region, instance type) across its zones."""

    gpu: str
    gpu_count: int
    vcpus: int
    ram_gib: float
    price: float
    spot: float | None
    zones: set[str] = field(default_factory=set)

    def add(self, price: float, spot: float | None, zone: str) -> None:
        self.price = min(self.price, price)
        if spot is not None:
            self.spot = spot if self.spot is None else min(self.spot, spot)
        if zone:
            self.zones.add(zone)


@dataclass(frozen=True)
class _Row:
    line: int
    instance_type: str
    accelerator: str
    count: float | None
    vcpus: float | None
    ram_gib: float | None
    price: float | None
    spot: float | None
    region: str
    zone: str


# ---------------------------------------------------------------- finding files


def _version_number(path: Path) -> int | None:
    match = re.fullmatch(r"v(\d+)", path.name)
    return int(match.group(1)) if match else None


def _cloud_files(directory: Path) -> list[tuple[str, Path]]:
    if (directory / "vms.csv").is_file():
        return [(directory.name, directory / "vms.csv")]
    versions = [p for p in directory.iterdir() if p.is_dir() and _version_number(p) is not None]
    if versions:
        directory = max(versions, key=lambda p: _version_number(p) or 0)
    return [
        (child.name, child / "vms.csv")
        for child in sorted(directory.iterdir())
        if child.is_dir() and (child / "vms.csv").is_file()
    ]


def find_skypilot_files(path: str | Path | None = None) -> list[tuple[str, Path]]:
    """(cloud, vms.csv) pairs: a file's cloud is its folder's name; a folder is searched
    for `vms.csv`, `<cloud>/vms.csv` or `v<N>/<cloud>/vms.csv` (newest N); no path:
    `~/.sky/catalogs`."""
    target = Path(path).expanduser() if path is not None else DEFAULT_ROOT.expanduser()
    if target.is_file():
        return [(target.parent.name, target)]
    if not target.is_dir():
        hint = "" if path is not None else " (is SkyPilot installed? give the catalog path)"
        raise UserError(f"no SkyPilot catalog at {target}{hint}")
    found = _cloud_files(target)
    if not found:
        raise UserError(f"no vms.csv under {target}; expected <version>/<cloud>/vms.csv")
    return found


# ---------------------------------------------------------------- parsing rows


def _number(cells: list[str], index: int | None, path: Path, line: int, name: str) -> float | None:
    if index is None or index >= len(cells):
        return None
    cell = cells[index].strip()
    if not cell or cell.lower() == "nan":
        return None
    try:
        value = float(cell)
    except ValueError:
        raise DataError(path, f"expected a number, got '{cell}'", line=line, column=name) from None
    if value < 0 or not math.isfinite(value):
        raise DataError(path, f"expected a number >= 0, got '{cell}'", line=line, column=name)
    return value


def _parse_row(cells: list[str], at: dict[str, int | None], path: Path, line: int) -> _Row:
    def text(name: str) -> str:
        index = at[name]
        return cells[index].strip() if index is not None and index < len(cells) else ""

    def number(name: str) -> float | None:
        return _number(cells, at[name], path, line, name)

    return _Row(
        line=line,
        instance_type=text("InstanceType"),
        accelerator=text("AcceleratorName"),
        count=number("AcceleratorCount"),
        vcpus=number("vCPUs"),
        ram_gib=number("MemoryGiB"),
        price=number("Price"),
        spot=number("SpotPrice"),
        region=text("Region"),
        zone=text("AvailabilityZone"),
    )


def read_vms_csv(path: Path) -> list[_Row]:
    """The rows of one SkyPilot vms.csv; DataError on a missing column or a bad number."""
    try:
        handle = path.open(newline="", encoding="utf-8-sig")
    except OSError as error:
        raise DataError(path, f"cannot read: {error}") from None
    with handle:
        reader = csv.reader(handle)
        header = [name.strip() for name in next(reader, [])]
        missing = [name for name in REQUIRED if name not in header]
        if missing:
            problem = f"missing column '{missing[0]}' (not a SkyPilot vms.csv?)"
            raise DataError(path, problem, line=1)
        at = {name: header.index(name) if name in header else None for name in REQUIRED + OPTIONAL}
        return [_parse_row(cells, at, path, reader.line_num) for cells in reader if cells]


# ---------------------------------------------------------------- rows to offers


class _Importer:
    """Turns one cloud's rows into the cheapest offer per (region, instance type)."""

    def __init__(self, gpus: dict[str, GPUSpec], known: dict[tuple[str, int], str]) -> None:
        self.gpus = gpus
        self.known = known
        """(instance type, GPU count) -> the GPU the catalog lists it with (this provider)."""
        self.names: dict[tuple[str, str, int], str | None] = {}
        self.refined: set[str] = set()
        self.best: dict[tuple[str, str], _Best] = {}
        self.hosts: dict[tuple[str, str, str], _Row] = {}
        self.host_rows = 0
        self.used_hosts: set[tuple[str, str, str]] = set()
        self.gpu_rows: list[tuple[_Row, str]] = []
        self.skipped: Counter[str] = Counter()
        self.unknown: Counter[str] = Counter()

    def gpu_name(self, accelerator: str, instance_type: str, count: int) -> str | None:
        """Catalog name of a SkyPilot accelerator on an instance type (see the module doc)."""
        key = (accelerator, instance_type, count)
        if key not in self.names:
            self.names[key] = self._resolve(accelerator, instance_type, count)
        return self.names[key]

    def _resolve(self, accelerator: str, instance_type: str, count: int) -> str | None:
        listed = self.known.get((instance_type.casefold(), count))
        normal = normalize_gpu_name(accelerator)
        if listed is not None and normal and normalize_gpu_name(listed).startswith(normal):
            spec = self.gpus.get(normal)
            if spec is None or spec.name != listed:
                self.refined.add(instance_type)
            return listed
        spec = None
        if "pcie" in instance_type.lower():
            spec = self.gpus.get(normalize_gpu_name(accelerator + " PCIe"))
        spec = spec or self.gpus.get(normal)
        return spec.name if spec else None

    def take(self, row: _Row) -> None:
        if not row.accelerator:
            if row.instance_type:
                self.hosts.setdefault((row.instance_type, row.region, row.zone), row)
                self.host_rows += 1
            else:
                self.skipped[SKIP_NO_ACCELERATOR] += 1
            return
        if row.count is None or row.count <= 0:
            self.skipped[SKIP_NO_ACCELERATOR] += 1
            return
        if row.count != int(row.count):
            self.skipped[SKIP_FRACTIONAL] += 1
            return
        gpu = self.gpu_name(row.accelerator, row.instance_type, int(row.count))
        if gpu is None:
            self.skipped[SKIP_UNKNOWN] += 1
            self.unknown[row.accelerator] += 1
        elif not row.instance_type:
            self.gpu_rows.append((row, gpu))
        else:
            self.offer(row, row.instance_type, gpu, row.price, row.spot)

    def offer(self, row: _Row, instance_type: str, gpu: str, price, spot) -> None:
        if price is None:
            self.skipped[SKIP_NO_PRICE] += 1
            return
        if row.vcpus is None or row.ram_gib is None or round(row.vcpus) < 1 or not row.ram_gib:
            self.skipped[SKIP_NO_SIZE] += 1
            return
        best = self.best.get((row.region, instance_type))
        if best is None:
            best = _Best(gpu, int(row.count or 0), round(row.vcpus), row.ram_gib, price, spot)
            self.best[(row.region, instance_type)] = best
        best.add(price, spot, row.zone)

    def attach_gpus_to_hosts(self) -> None:
        """GCP: price each GPU row on its default N1 host in the same zone."""
        for row, gpu in self.gpu_rows:
            if normalize_gpu_name(row.accelerator) not in N1_ATTACHABLE:
                self.skipped[SKIP_NOT_ATTACHABLE] += 1
                continue
            count = int(row.count or 0)
            host = None
            for family in ("n1-standard", "n1-highmem"):
                key = (f"{family}-{8 * count}", row.region, row.zone)
                host = self.hosts.get(key)
                if host is not None:
                    break
            if host is None:
                self.skipped[SKIP_NO_HOST] += 1
                continue
            self.used_hosts.add(key)
            both = host.price is not None and row.price is not None
            price = host.price + row.price if both else None
            spot = host.spot + row.spot if host.spot is not None and row.spot is not None else None
            sized = _Row(row.line, host.instance_type, row.accelerator, row.count, host.vcpus,
                         host.ram_gib, price, spot, row.region, row.zone)  # fmt: skip
            self.offer(sized, f"{host.instance_type}+{count}x{row.accelerator}", gpu, price, spot)
        unused_hosts = self.host_rows - len(self.used_hosts)
        if unused_hosts:
            self.skipped[SKIP_NO_ACCELERATOR] += unused_hosts


# ---------------------------------------------------------------- writing


def _shown(path: Path) -> str:
    """A path with the home directory written as '~'."""
    try:
        return "~/" + path.resolve().relative_to(Path.home().resolve()).as_posix()
    except (ValueError, RuntimeError):
        return str(path)


def _price(value: float | None) -> str:
    return "" if value is None else repr(round(value, 6))


def _write_offers(out: Path, provider: str, best: dict[tuple[str, str], _Best], source: str,
                  as_of: str) -> None:  # fmt: skip
    header = [column.name for column in OFFER_COLUMNS]
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("w", newline="", encoding="utf-8") as handle:
        handle.write(f"# Written by `cloudtrain catalog import-skypilot` from {source}\n")
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(header)
        for (region, instance_type), offer in sorted(best.items()):
            zone = next(iter(offer.zones)) if len(offer.zones) == 1 else ""
            writer.writerow([
                provider, region, zone, instance_type, offer.gpu, offer.gpu_count, offer.vcpus,
                repr(offer.ram_gib), "", "", "USD", _price(offer.price), _price(offer.spot),
                "", "", source, as_of,
            ])  # fmt: skip
    os.replace(tmp, out)


def _known_gpus(catalog: Catalog, provider: str) -> dict[tuple[str, int], str]:
    return {
        (offer.instance_type.casefold(), offer.gpu_count): offer.gpu
        for offer in catalog.offers
        if offer.provider.casefold() == provider
    }


def _import_cloud(cloud: str, path: Path, catalog: Catalog, dest: Path) -> CloudImport:
    provider = cloud.lower()
    rows = read_vms_csv(path)
    importer = _Importer(gpu_index(catalog.gpus), _known_gpus(catalog, provider))
    for row in rows:
        importer.take(row)
    importer.attach_gpus_to_hosts()
    mtime = path.stat().st_mtime
    as_of = dt.datetime.fromtimestamp(mtime, tz=dt.timezone.utc).date().isoformat()
    out = dest / f"skypilot_{re.sub(r'[^0-9A-Za-z_-]+', '_', provider)}_offers.csv"
    _write_offers(out, provider, importer.best, f"SkyPilot catalog {_shown(path)}", as_of)
    return CloudImport(
        cloud=cloud,
        provider=provider,
        source_file=str(path),
        output_file=str(out),
        rows_read=len(rows),
        offers_written=len(importer.best),
        skipped=dict(sorted(importer.skipped.items())),
        unknown_accelerators=dict(importer.unknown.most_common()),
        gpus_refined=sum(1 for _, it in importer.best if it in importer.refined),
    )


def _total(counters: Iterable[dict[str, int]]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for counter in counters:
        total.update(counter)
    return dict(total.most_common())


def import_skypilot(
    path: str | Path | None = None,
    *,
    cloud: str | None = None,
    dest_dir: str | Path | None = None,
    catalog: Catalog | None = None,
) -> ImportResult:
    """Import SkyPilot vms.csv files (see the module doc) into the user catalog directory.

    path: a vms.csv, a cloud or version folder, or a catalogs root (default
    `~/.sky/catalogs`, newest version, all clouds). cloud: the cloud of a single file
    whose folder is not named after it. dest_dir: where to write (default
    `paths.user_catalog_dir()`). catalog: the GPUs accelerators map to and the offers
    that refine them (default: `load_catalog()`, bundled and user rows).
    """
    files = find_skypilot_files(path)
    if cloud is not None:
        if len(files) != 1:
            raise UserError("--cloud applies to a single vms.csv; give its path")
        files = [(cloud, files[0][1])]
    catalog = catalog if catalog is not None else load_catalog()
    dest = Path(dest_dir) if dest_dir is not None else paths.user_catalog_dir()
    dest.mkdir(parents=True, exist_ok=True)
    clouds = tuple(_import_cloud(name, file, catalog, dest) for name, file in files)
    return ImportResult(
        clouds=clouds,
        rows_read=sum(c.rows_read for c in clouds),
        offers_written={c.cloud: c.offers_written for c in clouds},
        skipped=_total(c.skipped for c in clouds),
        unknown_accelerators=_total(c.unknown_accelerators for c in clouds),
    )
