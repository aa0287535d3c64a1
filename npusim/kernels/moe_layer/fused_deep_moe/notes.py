"""Stand-in for npusim.kernels.common.overlap until it is on this branch: the program calls
`note_remote` / `note_compute` with the tags the overlap figures group by; the stand-in
only returns the op and reports no overlap fields. Replaced by the shared module."""

from __future__ import annotations

from typing import Any


def note_remote(ctx: Any, op: Any, tag: str) -> Any:
    return op


def note_compute(ctx: Any, op: Any, tag: str) -> Any:
    return op


def layer_fields(run: Any, cores: Any, workers: dict[str, str],
                 hides: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    return {}
