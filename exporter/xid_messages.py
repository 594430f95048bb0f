"""XID code -> the ``err_msg`` label dcgm-exporter writes on ``DCGM_FI_DEV_XID_ERRORS``.

The table is data (``xid_messages.csv``, NVIDIA's XID catalogue as dcgm-exporter carries
it, commit named in the file); this module only reads it. A code past the table gets
dcgm-exporter's ``Unknown Error``, so a dashboard or rule that matches on ``err_msg``
reads the same values from gpufed-exporter as from dcgm-exporter (issue 42).
"""

from __future__ import annotations

import csv
from functools import cache
from pathlib import Path

TABLE = Path(__file__).with_name("xid_messages.csv")
UNKNOWN = "Unknown Error"


@cache
def messages() -> dict[int, str]:
    with TABLE.open(encoding="utf-8", newline="") as handle:
        rows = csv.DictReader(line for line in handle if not line.startswith("#"))
        return {int(row["code"]): row["message"] for row in rows}


def message(code: int) -> str:
    """dcgm-exporter's text for one XID code."""
    return messages().get(code, UNKNOWN)
