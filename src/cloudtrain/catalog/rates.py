"""Achievable rates: what share of a GPU's dense peak and memory bandwidth each kind of
kernel reaches, and its fixed cost per launch. Data, not code: the catalog's
`achievable.csv` (bundled, and any file with its columns in the user's catalog or
`--catalog`), each row with its source and date.

A row's `key` is a GPU name ('H200'), a CUDA compute capability ('8.6'), an
architecture ('hopper') or 'default'. A lookup takes the most specific row that
matches the GPU, then the kernel, dtype and layout ('any' in dtype or layout matches
all).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from cloudtrain.catalog import csvdata as cd
from cloudtrain.catalog.types import AchievableRate, GPUSpec

KERNELS = (
    "matmul",
    "conv",
    "conv_grouped",
    "conv_depthwise",
    "attention",
    "elementwise",
    "reduction",
    "data_movement",
    "optimizer",
    "host",
)
"""Kernel kinds with their own rates. 'host' is the CPU side of eager PyTorch: its
`overhead_us` is the host time to dispatch one op, which bounds a step made of many
small ops whatever the GPU."""
RATE_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "any")
LAYOUTS = ("nchw", "nhwc", "any")


def fraction(cell: str) -> float:
    value = cd.non_negative(cell)
    if value > 1.0:
        raise cd.CellError(f"expected a share of the peak in [0, 1], got '{cell}'")
    return value


ACHIEVABLE_COLUMNS = (
    cd.Column("key", "key", cd.text, required=True),
    cd.Column("kernel", "kernel", cd.one_of(*KERNELS), required=True),
    cd.Column("dtype", "dtype", cd.one_of(*RATE_DTYPES), required=True),
    cd.Column("layout", "layout", cd.one_of(*LAYOUTS), required=True),
    cd.Column("compute_fraction", "compute_fraction", fraction, required=True),
    cd.Column("bandwidth_fraction", "bandwidth_fraction", fraction, required=True),
    cd.Column("overhead_us", "overhead_us", cd.non_negative, required=True),
    cd.Column("source", "source", cd.text, required=True),
    cd.Column("as_of", "as_of", cd.iso_date, required=True),
)


class RateTable:
    """Achievable rates by (key, kernel, dtype, layout); later rows win."""

    def __init__(self, rows: Iterable[AchievableRate]) -> None:
        self._rows: dict[tuple[str, str, str, str], AchievableRate] = {}
        for row in rows:
            self._rows[(row.key.casefold(), row.kernel, row.dtype, row.layout)] = row
        self._cache: dict[tuple[str, str, str, str], AchievableRate] = {}

    def with_rows(self, rows: Iterable[AchievableRate]) -> RateTable:
        """A copy with `rows` over these (e.g. measured by `cloudtrain bench`)."""
        return RateTable([*self._rows.values(), *rows])

    def lookup(self, gpu: GPUSpec, kernel: str, dtype: str, layout: str = "any") -> AchievableRate:
        """The most specific row for this GPU; KeyError when not even 'default' has one."""
        cache_key = (gpu.name, kernel, dtype, layout)
        found = self._cache.get(cache_key)
        if found is not None:
            return found
        for key in _keys_of(gpu):
            for row_dtype in (dtype, "any"):
                for row_layout in (layout, "any"):
                    row = self._rows.get((key, kernel, row_dtype, row_layout))
                    if row is not None:
                        self._cache[cache_key] = row
                        return row
        raise KeyError(f"no achievable rate for {kernel} {dtype} on {gpu.name} (not even default)")


def rate_table(rows: Iterable[AchievableRate]) -> RateTable:
    """A table of `rows`, or of the bundled achievable.csv when there are none (a catalog
    built by hand)."""
    rows = list(rows)
    return RateTable(rows) if rows else _bundled_table()


@functools.cache
def _bundled_table() -> RateTable:
    from cloudtrain.catalog.loader import load_catalog

    return RateTable(load_catalog(include_user=False, kinds=("achievable",), use_cache=False).rates)


def _keys_of(gpu: GPUSpec) -> tuple[str, ...]:
    keys = [gpu.name.casefold()]
    if gpu.compute_capability:
        keys.append(gpu.compute_capability.casefold())
    keys += [gpu.architecture.casefold(), "default"]
    return tuple(keys)
