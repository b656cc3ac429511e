"""``prunereg.oneshot``'s calibration as wide as llm-compressor's: texts, tokenizer output, datasets, folder paths.

Whatever form it takes, the calibration reaches the engine as the token ids the
command line would cut from the same text; bad input is one line, before the
model changes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, AutoTokenizer

import prunereg
from prunereg._runtime.calibration import CLI_SPELLING, calibration_ids, samples_from_text_file
from tests.support.tiny_lm import VOCAB, random_text, save_tiny_llama_folder, tiny_llama
from tests.support.tiny_lm import calibration_ids as random_ids


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("dense")
    save_tiny_llama_folder(folder)
    return folder


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(model_dir)


class FakeDataset:
    """What calibration reads of a ``datasets.Dataset``: ``column_names`` and iteration over row dicts."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self.column_names = list(rows[0])
        self.rows_read = 0

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for row in self.rows:
            self.rows_read += 1
            yield dict(row)


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    left, right = _weights(a), _weights(b)
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


# -- every form gives the command line's ids ---------------------------------------------------------


def test_a_text_is_cut_as_the_command_line_cuts_its_file(tokenizer: Any, tmp_path: Path) -> None:
    text = random_text(300, seed=1)
    (tmp_path / "calibration.txt").write_text(text)
    from_file = samples_from_text_file(tokenizer, tmp_path / "calibration.txt", 4, 32, CLI_SPELLING)
    ids = calibration_ids(text, tokenizer=tokenizer, num_samples=4, seq_len=32)
    assert torch.equal(ids, from_file)
    assert torch.equal(ids, tokenizer(text, return_tensors="pt").input_ids[0][:128].reshape(4, 32))


def test_a_list_of_texts_is_tokenised_text_by_text_and_joined(tokenizer: Any) -> None:
    texts = [random_text(50, seed=s) for s in range(5)]
    joined = [i for text in texts for i in tokenizer(text).input_ids]
    ids = calibration_ids(texts, tokenizer=tokenizer, num_samples=3, seq_len=40)
    assert ids.tolist() == torch.tensor(joined[:120]).reshape(3, 40).tolist()
    generated = calibration_ids((t for t in texts), tokenizer=tokenizer, num_samples=3, seq_len=40)
    assert torch.equal(generated, ids)


def test_a_tokenizer_output_leaves_padding_out(tokenizer: Any) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    tokenizer.pad_token = "[UNK]"
    texts = [random_text(n, seed=n) for n in (20, 30, 25)]
    encoding = tokenizer(texts, padding=True, return_tensors="pt")
    assert type(encoding).__name__ == "BatchEncoding"
    joined = [i for text in texts for i in tokenizer(text).input_ids]
    ids = calibration_ids(encoding, num_samples=2, seq_len=30)
    assert ids.tolist() == torch.tensor(joined[:60]).reshape(2, 30).tolist()
    lists = calibration_ids(tokenizer(texts), num_samples=2, seq_len=30)  # lists of lists, no padding
    assert torch.equal(lists, ids)
    with pytest.raises(ValueError, match=r"^calibration rows hold 20 to 30 tokens \(padding left out\); pass seq_len="):
        calibration_ids(encoding)


def test_rows_of_one_length_are_the_samples_as_they_are(tokenizer: Any) -> None:
    encoding = tokenizer([random_text(16, seed=s) for s in range(3)], return_tensors="pt")
    assert torch.equal(calibration_ids(encoding), encoding["input_ids"])
    assert torch.equal(calibration_ids({"input_ids": encoding["input_ids"].tolist()}), encoding["input_ids"])


def test_a_dataset_text_column_is_read_only_as_far_as_needed(tokenizer: Any) -> None:
    rows = [{"text": random_text(40, seed=s), "label": s} for s in range(50)]
    dataset = FakeDataset(rows)
    ids = calibration_ids(dataset, tokenizer=tokenizer, num_samples=2, seq_len=50)
    expected = calibration_ids([row["text"] for row in rows], tokenizer=tokenizer, num_samples=2, seq_len=50)
    assert torch.equal(ids, expected)
    assert dataset.rows_read == 3  # 40 tokens a row, 100 needed


def test_a_dataset_of_token_ids_and_one_without_text_or_ids(tokenizer: Any) -> None:
    tokenised = FakeDataset([dict(tokenizer(random_text(16, seed=s))) for s in range(4)])
    assert calibration_ids(tokenised).shape == (4, 16)
    with pytest.raises(ValueError, match=r"^the calibration dataset has no 'text' or 'input_ids' column \(it has "):
        calibration_ids(FakeDataset([{"sentence": "w1 w2"}]), tokenizer=tokenizer)


def test_a_real_datasets_dataset_if_installed(tokenizer: Any) -> None:
    datasets = pytest.importorskip("datasets")
    texts = [random_text(40, seed=s) for s in range(5)]
    dataset = datasets.Dataset.from_dict({"text": texts})
    ids = calibration_ids(dataset, tokenizer=tokenizer, num_samples=2, seq_len=50)
    assert torch.equal(ids, calibration_ids(texts, tokenizer=tokenizer, num_samples=2, seq_len=50))


def test_oneshot_takes_a_text_and_prunes_as_with_its_ids(tokenizer: Any) -> None:
    text = random_text(300, seed=2)
    from_text, from_ids = tiny_llama(), tiny_llama()
    prunereg.oneshot(from_text, "wanda", calibration=text, tokenizer=tokenizer, num_samples=4, seq_len=32)
    ids = calibration_ids(text, tokenizer=tokenizer, num_samples=4, seq_len=32)
    prunereg.oneshot(from_ids, "wanda", calibration=ids)
    assert _same_weights(from_text, from_ids)


# -- a folder path as the model ------------------------------------------------------------------------


def test_a_folder_path_is_loaded_with_its_own_tokenizer_and_the_model_is_in_the_report(
    model_dir: Path, tokenizer: Any
) -> None:
    text = random_text(300, seed=3)
    report = prunereg.oneshot(str(model_dir), "wanda", calibration=text, num_samples=4, seq_len=32, sparsity=0.5)
    expected = AutoModelForCausalLM.from_pretrained(model_dir)
    prunereg.oneshot(
        expected, "wanda", calibration=tokenizer(text, return_tensors="pt").input_ids[0][:128].reshape(4, 32)
    )
    pruned = report.model
    assert isinstance(pruned, torch.nn.Module) and "model" not in report.as_dict()
    assert _same_weights(pruned, expected)


def test_a_folders_own_code_never_runs(model_dir: Path, tmp_path: Path) -> None:
    import json
    import shutil

    folder = tmp_path / "remote"
    shutil.copytree(model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "evil.Model", "AutoConfig": "evil.Config"}
    (folder / "config.json").write_text(json.dumps(config))
    marker = tmp_path / "ran"
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    report = prunereg.oneshot(folder, "wanda", calibration=random_ids(2, 8))
    assert type(report.model).__name__ == "LlamaForCausalLM"  # transformers' own class
    assert not marker.exists()


def test_oneshot_folder_tokenises_a_text_with_the_folders_tokenizer(model_dir: Path, tmp_path: Path) -> None:
    text = random_text(300, seed=4)
    prunereg.oneshot_folder(model_dir, tmp_path / "out", "wanda", calibration=text, num_samples=4, seq_len=32)
    report = prunereg.oneshot(model_dir, "wanda", calibration=text, num_samples=4, seq_len=32)
    streamed = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert _same_weights(streamed, report.model)


# -- ignore= beside layers= ------------------------------------------------------------------------------


def test_ignore_globs_leave_layers_dense() -> None:
    model = tiny_llama()
    report = prunereg.oneshot(model, "magnitude", calibration=random_ids(2, 8), ignore=["*.mlp.*", "lm_head"])
    names = {layer.name for layer in report.layers}
    assert names and not any(".mlp." in name for name in names)
    assert (model.model.layers[0].mlp.up_proj.weight == 0).sum() == 0
    assert report.layers[0].sparsity == pytest.approx(0.5)
    with_layers = prunereg.oneshot(tiny_llama(), "magnitude", calibration=random_ids(2, 8), layers=["*proj"],
                                   ignore=["*.layers.1.*"])  # fmt: skip
    assert {layer.name.split(".")[2] for layer in with_layers.layers} == {"0"}


def test_an_ignore_pattern_that_matches_nothing_is_named() -> None:
    model = tiny_llama()
    before = _weights(model)
    with pytest.raises(ValueError, match=r"^ignore \['\*\.mpl\.\*'\] match no module of the model$"):
        prunereg.oneshot(model, "magnitude", calibration=random_ids(2, 8), ignore=["*.mpl.*"])
    assert all(torch.equal(a, b) for a, b in zip(before.values(), _weights(model).values(), strict=True))


# -- what is refused, in one line, before the model changes -------------------------------------------


def _refused(calibration: object, match: str, error: type[Exception] = ValueError, **options: Any) -> None:
    model = tiny_llama()
    before = _weights(model)
    with pytest.raises(error, match=match) as raised:
        prunereg.oneshot(model, "wanda", calibration=calibration, **options)
    assert "\n" not in str(raised.value)
    assert all(torch.equal(a, b) for a, b in zip(before.values(), _weights(model).values(), strict=True))


def test_a_1d_tensor_is_refused_with_the_shape_to_pass() -> None:
    _refused(
        torch.randint(0, VOCAB, (64,)),
        r"^calibration is a 1-D tensor of 64 token ids; pass shape \(samples, seq_len\): ids.reshape\(-1, seq_len\)",
    )


def test_token_ids_beyond_the_vocabulary_are_refused_before_pruning() -> None:
    ids = random_ids(2, 8)
    ids[1, 3] = VOCAB + 5
    _refused(ids, rf"^the calibration samples hold the token id {VOCAB + 5}, but the model's vocabulary has {VOCAB} ")
    _refused(ids - VOCAB - 10, r"^the calibration samples hold the token id -\d+; token ids are never negative$")


def test_samples_longer_than_the_model_allows_are_refused_before_pruning() -> None:
    _refused(
        torch.randint(0, VOCAB, (2, 129)),
        r"^the calibration samples hold 129 tokens, but the model takes at most 128 \(max_position_embeddings in "
        r"its config\); use shorter samples$",
    )


def test_perplexity_refuses_ids_the_model_cannot_read() -> None:
    with pytest.raises(ValueError, match=r"^the windows of ids hold 200 tokens, .* pass a smaller window$"):
        prunereg.perplexity(tiny_llama(), torch.randint(0, VOCAB, (400,)), window=200)
    with pytest.raises(ValueError, match=rf"^the windows of ids hold the token id {VOCAB}, "):
        prunereg.perplexity(tiny_llama(), torch.full((10,), VOCAB), window=8)


def test_text_without_a_tokenizer_and_cutting_token_ids_are_refused(tokenizer: Any) -> None:
    _refused(
        "w1 w2 w3", r"^calibration text needs a tokenizer: pass tokenizer=, or the model as a folder path$", TypeError
    )
    _refused(random_ids(2, 8), r"^num_samples and seq_len cut texts and tokenizer output; calibration is already ",
             num_samples=2)  # fmt: skip
    _refused(b"w1 w2", r"^calibration text must be str, not bytes", TypeError)
    _refused(3.5, r"^calibration must be token ids \(a tensor\), a text, a list of texts, ", TypeError)
    _refused("w1 w2 w3", r"^the calibration text has 3 tokens; num_samples=64 x seq_len=256 needs 16384$",
             tokenizer=tokenizer)  # fmt: skip
    _refused("w1 w2 w3", r"^seq_len must be an int >= 2, got 1$", tokenizer=tokenizer, seq_len=1)
