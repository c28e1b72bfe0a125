"""Dataset readers, converters (EasyR1, TRL, veRL) and bad-row handling of `vlm.data.load`."""

from __future__ import annotations

import io
import json
import os

import pytest
from PIL import Image

from vlm.converters import detect, easyr1, trl, verl
from vlm.data import DataError, load, load_with_report


def _png(color=(200, 0, 0), size=(20, 16)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def _write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(_png())
    (tmp_path / "img" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    return tmp_path


def test_converters():
    e = easyr1({"problem": "<image>Find x.", "answer": "3", "images": ["a.png"], "level": 2})
    assert e == {"prompt": "<image>Find x.", "answer": "3", "images": ["a.png"], "level": 2}
    t = trl({"prompt": [{"role": "system", "content": "Be terse."},
                        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Count."}]}],
             "image": "a.png", "solution": "4"})
    assert t == {"prompt": "<image>Count.", "images": ["a.png"], "answer": "4", "system": "Be terse."}
    v = verl({"data_source": "hiyouga/geometry3k", "prompt": [{"role": "user", "content": "<image>Find y."}],
              "images": [{"bytes": b"x", "path": None}], "ability": "math",
              "reward_model": {"style": "rule", "ground_truth": "12"}, "extra_info": {"split": "train"}})
    assert v["prompt"] == "<image>Find y." and v["answer"] == "12" and v["images"] == [{"bytes": b"x", "path": None}]
    assert v["data_source"] == "hiyouga/geometry3k" and "reward_model" not in v
    assert [detect(r) for r in ({"problem": "x"}, {"prompt": [{"role": "user", "content": "x"}]},
                                {"prompt": "x", "reward_model": {}}, {"prompt": "x"})] == ["easyr1", "trl", "verl", "mmrl"]


def test_jsonl_relative_images_and_meta(folder):
    path = folder / "train.jsonl"
    _write_jsonl(path, [{"problem": "How many?", "images": ["img/a.png"], "answer": "1", "difficulty": "easy"}])
    rows = load(str(path))
    assert rows[0]["images"] == [str(folder / "img" / "a.png")] and rows[0]["difficulty"] == "easy"
    assert rows[0]["_source"] == str(path) and rows[0]["_row"] == 0


def test_parquet_and_json_with_embedded_bytes(folder):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt": [{"role": "user", "content": "<image>What colour?"}], "images": [{"bytes": _png(), "path": None}],
             "reward_model": {"style": "rule", "ground_truth": "red"}, "data_source": "toy"}]
    pq.write_table(pa.Table.from_pylist(rows), folder / "train.parquet")
    got = load(str(folder / "train.parquet"))
    assert got[0]["answer"] == "red" and got[0]["images"][0]["bytes"].startswith(b"\x89PNG")
    with open(folder / "train.json", "w") as f:
        json.dump([{"prompt": "Describe.", "image": "img/a.png", "answer": "a square"}], f)
    assert load(str(folder / "train.json"))[0]["images"] == [str(folder / "img" / "a.png")]


@pytest.mark.parametrize("row, reason", [
    ({"prompt": "  ", "images": ["img/a.png"], "answer": "1"}, "empty prompt"),
    ({"prompt": "How many?", "images": ["img/a.png"]}, "missing answer"),
    ({"prompt": "How many?", "images": ["img/none.png"], "answer": "1"}, "image 0: image file .* does not exist"),
    ({"prompt": "How many?", "images": ["img/broken.png"], "answer": "1"}, "image 0: image .* is corrupt"),
    ({"prompt": "<image><image> Compare.", "images": ["img/a.png"], "answer": "1"}, "prompt has 2 <image> marks but the row has 1"),
    ({"answer": "1"}, "no 'prompt'"),
])
def test_bad_rows_name_file_and_row(folder, row, reason):
    path = folder / "train.jsonl"
    good = {"prompt": "How many?", "images": ["img/a.png"], "answer": "1"}
    _write_jsonl(path, [good, good, row, good])
    with pytest.raises(DataError, match=rf"train.jsonl, row 2: {reason}"):
        load(str(path))
    rows, report = load_with_report(str(path), skip_bad_rows=True)
    assert len(rows) == 3 and report.kept == 3 and len(report.skipped) == 1
    assert report.skipped[0].startswith("row 2:")


def test_bad_json_line_and_missing_file(folder):
    (folder / "bad.jsonl").write_text('{"prompt": "a", "answer": 1}\n{not json\n')
    with pytest.raises(DataError, match=r"bad.jsonl, row 1 \(line 2\): not valid JSON"):
        load(str(folder / "bad.jsonl"))
    with pytest.raises(DataError, match="does not exist"):
        load(str(folder / "nope.jsonl"))
    with pytest.raises(DataError, match="unknown dataset format 'llava'"):
        load(str(folder / "bad.jsonl"), format="llava")


def test_hf_datasets_folders(folder):
    datasets = pytest.importorskip("datasets")
    if not hasattr(datasets, "Dataset"):   # the repo's datasets/ recipe folder, not the package
        pytest.skip("the 'datasets' package is not installed")
    ds = datasets.Dataset.from_dict({"problem": ["How many?", "Which?"], "answer": ["1", "B"],
                                     "images": [[Image.open(io.BytesIO(_png()))], [Image.open(io.BytesIO(_png((0, 0, 9))))]]},
                                    features=datasets.Features({"problem": datasets.Value("string"),
                                                                "answer": datasets.Value("string"),
                                                                "images": datasets.Sequence(datasets.Image())}))
    ds.save_to_disk(str(folder / "saved"))
    rows = load(str(folder / "saved"))
    assert len(rows) == 2 and rows[0]["prompt"] == "How many?"
    assert isinstance(rows[0]["images"][0], dict) and rows[0]["images"][0]["bytes"]   # lazy: not decoded
    os.makedirs(folder / "repo" / "data")
    ds.to_parquet(str(folder / "repo" / "data" / "train-00000.parquet"))
    rows = load(str(folder / "repo"), split="train")
    assert [r["answer"] for r in rows] == ["1", "B"]


def test_loaded_rows_train_end_to_end(folder, make_policy):
    from mmrl.types import PromptBatch

    path = folder / "train.jsonl"
    _write_jsonl(path, [{"problem": "<image> How many squares?", "images": ["img/a.png"], "answer": "1", "k": 5}])
    rows = load(str(path))
    policy = make_policy("qwen2_5_vl", max_new_tokens=3)
    ro = policy.rollout(PromptBatch(rows=rows, index=[0], seeds=[0], step=0), group_size=2)
    assert ro.samples[0].meta["k"] == 5 and "_source" not in ro.samples[0].meta
    assert ro.samples[0].prompt == "<image> How many squares?" and ro.samples[0].answer == "1"


def test_plain_rows_errors_name_the_record(make_policy):
    from mmrl.config import ConfigError
    from mmrl.types import PromptBatch

    policy = make_policy("qwen2_5_vl")
    with pytest.raises(ConfigError, match=r"data.train, row 5: image file .* does not exist"):
        policy.rollout(PromptBatch(rows=[{"prompt": "x", "images": ["/no/such.png"], "answer": "1"}],
                                   index=[5], seeds=[0], step=0), group_size=1)
    with pytest.raises(ConfigError, match=r"data.eval, row 2: missing answer"):
        policy.generate_eval(PromptBatch(rows=[{"prompt": "x"}], index=[2], seeds=[0], step=-1))


def test_hf_folder_without_the_datasets_package(folder, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)                 # import fails as if not installed
    os.makedirs(folder / "hfdir")
    with pytest.raises(DataError, match="needs the 'datasets' package"):
        load(str(folder / "hfdir"))
