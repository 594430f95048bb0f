"""The XID series carry dcgm-exporter's ``err_msg`` next to ``err_code`` (issue 42)."""

from __future__ import annotations

from exporter import xid_messages


def test_table_covers_every_code_from_zero_without_gaps() -> None:
    table = xid_messages.messages()
    assert sorted(table) == list(range(len(table)))
    assert len(table) > 150  # dcgm-exporter's table reaches 172
    assert all(text.strip() == text and text for text in table.values())


def test_known_and_unknown_codes_read_as_dcgm_exporter_writes_them() -> None:
    assert xid_messages.message(79) == "GPU has fallen off the bus"
    assert xid_messages.message(0) == "No Error"
    assert xid_messages.message(len(xid_messages.messages())) == "Unknown Error"
    assert xid_messages.message(-1) == "Unknown Error"
