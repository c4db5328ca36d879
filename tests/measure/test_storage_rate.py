"""``calibrate``'s storage write rate: a real file, fsync-ed, removed afterwards."""

import math

from playbook.measure.calibrate import storage_write_rate


def test_the_storage_rate_is_a_real_write_that_leaves_nothing_behind(tmp_path):
    rate = storage_write_rate(4 << 20, folder=str(tmp_path))
    assert math.isfinite(rate) and 1e6 < rate < 1e12  # bytes/s: between a floppy and memory
    assert list(tmp_path.iterdir()) == []
