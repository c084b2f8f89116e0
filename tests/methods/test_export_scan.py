"""The DP export's leak scan reads what a reader of each file reads: parsed JSON strings (escapes
decoded), safetensors header metadata, and raw bytes."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from pipeline_src.methods.export import leaked_member
from pipeline_src.store.atomic import write_json

IDS = ["café/ü.png", 'train/"quoted"\\name', "x" * 5000 + "/long.png", "日本/画像.png"]


@pytest.mark.parametrize("member", IDS)
def test_a_member_id_in_a_json_record_is_found_however_it_is_escaped(tmp_path, member):
    path = tmp_path / "model.json"
    write_json({"note": f"trained on {member} and others", "nested": [{"k": member}]}, path)
    assert member.encode() not in path.read_bytes() or member.isascii()  # json.dumps escapes non-ASCII
    assert leaked_member(path, {member, "someone-else"}) == member
    write_json({"note": "nothing here"}, path)
    assert leaked_member(path, {member}) is None


@pytest.mark.parametrize("member", IDS)
def test_a_member_id_in_safetensors_metadata_is_found(tmp_path, member):
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(2)}, path, metadata={"source": member})
    assert leaked_member(path, {member}) == member
    save_file({"w": torch.zeros(2)}, path, metadata={"source": "public"})
    assert leaked_member(path, {member}) is None


def test_a_member_id_in_a_raw_text_file_is_found(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("see café/ü.png\n", encoding="utf-8")
    assert leaked_member(path, {"café/ü.png"}) == "café/ü.png"


@pytest.mark.parametrize("member", ["cafe/a.png", "nul\x00in/id.png"])
def test_a_member_id_written_with_unusual_escapes_is_found_in_the_parsed_strings(tmp_path, member):
    path = tmp_path / "model.json"
    escaped = "".join(f"\\u{ord(c):04x}" for c in member)  # every character escaped: no raw or json.dumps form
    path.write_text('{"note": "x", "k": ["' + escaped + '"]}')
    assert member.encode() not in path.read_bytes()
    assert leaked_member(path, {member, "someone-else"}) == member
