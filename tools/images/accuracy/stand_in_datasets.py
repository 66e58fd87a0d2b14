"""Generated stand-ins for the accuracy tasks' two Hub datasets, put in the image's HF
datasets cache the way `datasets.load_dataset` caches a Hub dataset, so the shipped tasks
(k3infra/accuracy/tasks: `openai/gsm8k` main, `allenai/ai2_arc` ARC-Challenge) load
offline as they do in a user's image. No Hub is reachable here: the rows are generated
(the datasets' own columns, a handful of arithmetic items), never the real data.

Each stand-in is written as a local parquet repo with a README `configs:` block (the
Hub's layout) and prepared by `datasets` itself (load_dataset_builder +
download_and_prepare); the prepared folder is then filed under the Hub name's cache path
(`<namespace>___<name>/<config>/...`), where datasets' offline lookup
(CachedDatasetModuleFactory) finds it.

    python stand_in_datasets.py CACHE_DIR      # HF_DATASETS_CACHE of the image
"""
from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq


def gsm8k_rows(n: int, offset: int) -> list[dict]:
    rows = []
    for i in range(offset, offset + n):
        a, b = 3 + 7 * i % 41, 5 + 11 * i % 37
        rows.append({"question": f"A crate holds {a} apples and another holds {b}. "
                                 "How many apples are there in all?",
                     "answer": f"Add the two crates: {a} + {b} = {a + b}.\n#### {a + b}"})
    return rows


def arc_rows(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        a, b = 2 + i % 9, 3 + 5 * i % 11
        right = a * b
        options = [right - 1, right, right + 1, right + 10]
        key = "ABCD"[i % 4]
        options[[*"ABCD"].index(key)], options[1] = options[1], options[[*"ABCD"].index(key)]
        rows.append({"id": f"stand-in-{i}", "question": f"What is {a} times {b}?",
                     "choices": {"text": [str(o) for o in options], "label": list("ABCD")},
                     "answerKey": key})
    return rows


# Hub name, config, splits (split -> rows).
STAND_INS = [
    ("openai/gsm8k", "main", {"train": gsm8k_rows(8, 1000), "test": gsm8k_rows(32, 0)}),
    ("allenai/ai2_arc", "ARC-Challenge", {"test": arc_rows(32)}),
]


def stand_in(cache: Path, repo: str, config: str, splits: dict[str, list[dict]]) -> Path:
    namespace, name = repo.split("/")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / name
        (src / config).mkdir(parents=True)
        data_files = []
        for split, rows in splits.items():
            pq.write_table(pa.Table.from_pylist(rows), src / config / f"{split}-00000-of-00001.parquet")
            data_files.append(f"  - split: {split}\n    path: {config}/{split}-*")
        (src / "README.md").write_text(
            f"---\nconfigs:\n- config_name: {config}\n  data_files:\n" + "\n".join(data_files)
            + f"\n---\nGenerated stand-in for {repo} ({config}): not its data.\n")
        work = Path(tmp) / "cache"
        builder = datasets.load_dataset_builder(str(src), config, cache_dir=str(work))
        builder.download_and_prepare()
        prepared = Path(builder.cache_dir)
        # <work>/<name>/<config>/<version>/<hash>: filed under the Hub name's folder.
        target = cache / f"{namespace}___{name}" / prepared.relative_to(work / name)
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(prepared, target)
    return target


def main(argv: list[str]) -> int:
    cache = Path(argv[1])
    for repo, config, splits in STAND_INS:
        print(f"stand-in {repo} {config}: {stand_in(cache, repo, config, splits)}")
    # Proof, as the Job loads them: offline, by Hub name.
    datasets.config.HF_HUB_OFFLINE = True
    for repo, config, splits in STAND_INS:
        loaded = datasets.load_dataset(repo, config, cache_dir=str(cache))
        assert {s: len(loaded[s]) for s in loaded} == {s: len(r) for s, r in splits.items()}, loaded
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
