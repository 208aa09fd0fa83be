"""An export has a checkpoint's integrity: it never shadows the run's checkpoints, a re-export cut short leaves
the old export whole, a flipped bit in a tensor, a record or config.json of another run (another run of the same
config included, its record copied in alone or with its config.json) or a config.json whose sizes are not the
model's is refused on load, and no symbolic link is followed when writing."""

import json
import os
import struct

import numpy as np
import pytest
from flax import nnx

from retention import export as export_module
from retention import load_run
from retention.export import export_run
from retention.load import read_run
from retention.train.record import record_digest
from tests.train.common import fresh_seed
from tests.train.test_checkpoint import assert_same_params


def test_an_export_never_shadows_the_runs_checkpoints(finished_run, tmp_path):
    run = finished_run.copy(tmp_path / "run")
    with pytest.raises(ValueError, match=r"out must be a folder of its own, got .*a run folder"):
        export_run(str(run), str(run), step=2)
    with pytest.raises(ValueError, match=r"a run folder"):
        export_run(str(run), str(finished_run.folder), step=2)  # another run's folder
    export_run(str(run), str(tmp_path / "out"), step=2)
    for name in ("config.json", "model.safetensors", "run_record.json"):  # an export copied into the run folder by hand
        os.link(tmp_path / "out" / name, run / name)
    loaded = read_run(str(run))
    assert loaded.step == 4  # the checkpoints rule a run folder
    assert_same_params(nnx.state(loaded.model), finished_run.params[4])
    assert read_run(str(tmp_path / "out")).step == 2


def test_a_re_export_cut_short_leaves_the_old_export(finished_run, tmp_path, monkeypatch):
    out = tmp_path / "out"
    export_run(str(finished_run.folder), str(out), step=3)

    save_file = export_module.save_file

    def killed(*args, **kwargs):
        save_file(*args, **kwargs)
        raise KeyboardInterrupt  # after the weights, before config.json

    monkeypatch.setattr(export_module, "save_file", killed)
    with pytest.raises(KeyboardInterrupt):
        export_run(str(finished_run.folder), str(out), step=4)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["out"]  # nothing left aside
    loaded = read_run(str(out))
    assert loaded.step == 3
    assert_same_params(nnx.state(loaded.model), finished_run.params[3])
    export_run(str(finished_run.folder), str(out), step=4)  # a whole re-export replaces it
    assert read_run(str(out)).step == 4 and sorted(os.listdir(tmp_path)) == ["out"]


def tensor_offsets(path) -> dict[str, tuple[int, int, str]]:
    """{name: (first byte, end byte, dtype)} of each tensor in a safetensors file, read from its header."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    return {
        k: (8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1], v["dtype"])
        for k, v in header.items()
        if k != "__metadata__"
    }


def test_a_flipped_exponent_bit_is_refused(finished_run, tmp_path):
    out = tmp_path / "out"
    export_run(str(finished_run.folder), str(out))
    path = out / "model.safetensors"
    rng = np.random.default_rng(fresh_seed())
    offsets = {k: v for k, v in tensor_offsets(path).items() if v[2] == "F32"}
    name = sorted(offsets)[rng.integers(len(offsets))]
    first, end, _ = offsets[name]
    byte = first + 4 * int(rng.integers((end - first) // 4)) + 3  # the top byte of a little-endian float32
    raw = bytearray(open(path, "rb").read())
    raw[byte] ^= 0x40  # the exponent's top bit: a value of ~1 becomes ~1e38 or inf
    open(path, "wb").write(bytes(raw))
    with pytest.raises(
        ValueError, match=rf"model.safetensors is damaged: 1 tensors differ from their checksums \(\['{name}'\]"
    ):
        load_run(str(out))


def test_a_record_or_config_of_another_run_is_refused(finished_run, tmp_path):
    out = tmp_path / "out"
    export_run(str(finished_run.folder), str(out))
    saved = json.load(open(out / "run_record.json"))
    record = saved["record"]
    record["lm"]["deg"] = 4  # the same shapes, another model
    record["config"]["model"]["deg"] = 4
    digest = record_digest(record)
    json.dump({**saved, "record": record, "record_sha256": digest}, open(out / "run_record.json", "w"))
    with pytest.raises(ValueError, match=r"config.json and .*run_record.json are of different exports"):
        load_run(str(out))
    config = json.load(open(out / "config.json"))
    config["retention_export"]["record_sha256"] = digest
    json.dump(config, open(out / "config.json", "w"))
    with pytest.raises(ValueError, match=r"config.json is damaged: retention_lm="):
        load_run(str(out))  # config.json's mixer settings are the old record's
    json.dump({**saved, "record": record}, open(out / "run_record.json", "w"))  # its own sha256 left as it was
    with pytest.raises(ValueError, match=r"run_record.json is damaged: its run record does not match its sha256"):
        load_run(str(out))
    export_run(str(finished_run.folder), str(out))
    config = json.load(open(out / "config.json"))
    json.dump({**config, "hidden_size": 128}, open(out / "config.json", "w"))  # a size that is not the model's
    with pytest.raises(ValueError, match=r"config.json is damaged: hidden_size=128, the run record's model has 16"):
        load_run(str(out))


def test_no_symlink_is_followed(finished_run, tmp_path):
    out = tmp_path / "out"
    export_run(str(finished_run.folder), str(out), step=1)
    target = tmp_path / "precious.json"
    target.write_text("keep me")
    for name in ("config.json", "run_record.json"):
        os.remove(out / name)
        os.symlink(target, out / name)
    export_run(str(finished_run.folder), str(out), step=2)
    assert target.read_text() == "keep me" and not os.path.islink(out / "config.json")
    assert not os.path.islink(out / "run_record.json")
    assert read_run(str(out)).step == 2
    os.symlink(out, tmp_path / "link")
    with pytest.raises(ValueError, match=r"out must not be a symbolic link"):
        export_run(str(finished_run.folder), str(tmp_path / "link"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"out must be empty or an export folder, got .* holding \['notes.txt'\]"):
        export_run(str(finished_run.folder), str(tmp_path / "other"))


def test_the_record_of_another_run_copied_into_an_export_is_refused(finished_run, tmp_path):
    """Another run of the same config (another seed: the same shapes and config.json fields, other weights): its
    run_record.json copied into this run's export is refused, alone (config.json names this run's record) and with
    its config.json (the weights file names this run's record)."""
    out = tmp_path / "out"
    export_run(str(finished_run.folder), str(out))
    saved = json.load(open(out / "run_record.json"))
    other = {**saved["record"], "config": {**saved["record"]["config"], "seed": saved["record"]["config"]["seed"] + 1}}
    digest = record_digest(other)
    config = json.load(open(out / "config.json"))
    other_config = {**config, "retention_export": {**config["retention_export"], "record_sha256": digest}}
    json.dump({**saved, "record": other, "record_sha256": digest}, open(out / "run_record.json", "w"))
    with pytest.raises(ValueError, match=r"config.json and .*run_record.json are of different exports"):
        load_run(str(out))
    json.dump(other_config, open(out / "config.json", "w"))
    with pytest.raises(ValueError, match=r"model.safetensors and .*run_record.json are of different exports"):
        load_run(str(out))
