"""Issue 48: chapter 8b's calibration label is true on the reader's machine. The shipped profile of
``data/measurements/cpu-2core`` was measured elsewhere, under load; what the chapter prints names
that machine, its date and load from the file, and says whether the reader's machine is it."""

from __future__ import annotations

import json
from pathlib import Path

from playbook.viz.calibrate import measured_on, measured_where

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "data" / "measurements" / "cpu-2core" / "profile.json"
CHAPTER = ROOT / "notebooks" / "08b_planning.ipynb"


def _shipped() -> dict:
    return json.loads(SHIPPED.read_text())


def test_the_shipped_profile_is_labelled_with_its_own_machine_date_and_load():
    raw = _shipped()
    assert "on vm (2 CPUs)" in raw["source"]  # what the file says of its machine
    assert measured_on(raw) == ("vm", 2)
    before, after = raw["load_average"]["before"][0], raw["load_average"]["after"][0]
    label = measured_where(raw, here=("reader", 16))
    assert label.startswith(f"measured on vm (2 CPUs), {raw['date']}, ")
    assert f"load average {before:.1f} before, {after:.1f} after" in label  # 11.1 and 10.1 in the file
    assert "not this machine (reader, 16 CPUs)" in label and "playbook calibrate --out" in label


def test_only_a_machine_of_the_same_name_and_cpus_is_not_called_another():
    raw = _shipped()
    assert measured_where(raw, here=("vm", 2)).endswith("a machine of this one's name and CPU count")
    assert "not this machine" in measured_where(raw, here=("vm", 8))  # same name, other CPUs
    assert "not this machine" in measured_where(raw, here=("laptop", 2))


def test_fields_a_calibration_writes_come_first_and_a_bare_profile_is_unnamed():
    raw = _shipped() | {"host": "node-7", "cpus": 64}
    assert measured_on(raw) == ("node-7", 64)
    bare = {k: v for k, v in _shipped().items() if k not in ("source", "load_average", "date")}
    label = measured_where(bare, here=("vm", 2))
    assert label == (
        "measured on an unnamed machine, date not recorded, load not recorded; not this machine (vm, 2 CPUs): "
        "`playbook calibrate --out mine.json` measures it"
    )


def test_the_chapter_prints_the_label_of_the_profile_it_shows():
    cells = json.loads(CHAPTER.read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    assert not any("on this machine" in t.splitlines()[0] for t in text if t.startswith("#")), "a heading claims it"
    shown = next(t for t in text if "calibration_figure(profile)" in t)
    assert "print(measured_where(profile))" in shown  # the label is computed from the profile drawn
