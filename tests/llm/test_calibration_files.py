"""Calibration and evaluation texts: only regular files, read and tokenised no further than the tokens used.

The ids kept must be those of tokenising the whole text (the benchmark's
perplexities depend on them), with byte-level BPE (GPT-2, SmolLM2) and
SentencePiece-style (Llama) pre-tokenisation alike.
"""

from __future__ import annotations

import itertools
import os
import random
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

pytest.importorskip("transformers")

from prunereg._cli import main
from prunereg._runtime.calibration import (
    CLI_SPELLING,
    MARGIN,
    TextFile,
    all_token_ids,
    first_token_ids,
    samples_from_text_file,
    text_file_ids,
)
from tests.support.fifos import fifo_unblocker
from tests.support.tiny_lm import save_tiny_llama_folder

_WORDS = ["the", "king", "Rome", "lord", "people", "noble", "Marcius,", "citizens!", "hunger;", "corn?", "honour-bound"]


def english_like(n_words: int, seed: int = 0) -> str:
    """Words, punctuation, runs of spaces and blank lines: the places where tokenisers merge across."""
    rng = random.Random(seed)
    parts = []
    for _ in range(n_words):
        parts.append(rng.choice(_WORDS))
        parts.append(rng.choice([" ", " ", " ", "  ", "\n", "\n\n", "\t", " -- ", "... "]))
    return "".join(parts)


def bpe_tokenizer(kind: str) -> Any:
    """A small BPE tokenizer trained here: byte-level (GPT-2's scheme) or Metaspace (SentencePiece's), with a BOS."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    if kind == "byte-level":
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        backend.pre_tokenizer = pre_tokenizers.Metaspace()
        alphabet = []
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "<unk>"], initial_alphabet=alphabet)
    backend.train_from_iterator([english_like(3000, seed=9)], trainer)
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", unk_token="<unk>")


class Counting:
    """A tokenizer that counts its calls and the characters it was given."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.lengths: list[int] = []

    @property
    def calls(self) -> int:
        return len(self.lengths)

    @property
    def chars(self) -> int:
        return sum(self.lengths)

    def __call__(self, text: str, **options: Any) -> Any:
        self.lengths.append(len(text))
        return self.tokenizer(text, **options)

    def __getattr__(self, name: str) -> Any:  # is_fast and the rest: the tokenizer's own
        return getattr(self.tokenizer, name)


@pytest.fixture(scope="module", params=["byte-level", "metaspace"])
def tokenizer(request: pytest.FixtureRequest) -> Any:
    return bpe_tokenizer(request.param)


@pytest.mark.parametrize("limit", [1, 100, 4000, 100_000])
@pytest.mark.parametrize("special", [True, False])
def test_the_first_tokens_are_those_of_the_whole_text(tokenizer: Any, limit: int, special: bool) -> None:
    text = english_like(20_000, seed=3)
    whole = tokenizer(text, add_special_tokens=special)["input_ids"]
    assert first_token_ids(tokenizer, text, limit, add_special_tokens=special) == whole[:limit]


def test_a_text_file_gives_the_ids_of_reading_it_whole(tokenizer: Any, tmp_path: Path) -> None:
    path = tmp_path / "play.txt"
    path.write_bytes(english_like(20_000, seed=4).replace("\n", "\r\n").encode("utf-8") + "é œ\r".encode())
    whole = tokenizer(path.read_text(encoding="utf-8"), return_tensors="pt").input_ids[0]  # the command's old way
    assert text_file_ids(tokenizer, path, None).tolist() == whole.tolist()
    assert text_file_ids(tokenizer, path, 3000).tolist() == whole[:3000].tolist()
    samples = samples_from_text_file(tokenizer, path, 8, 256, CLI_SPELLING)
    assert samples.tolist() == whole[: 8 * 256].reshape(8, 256).tolist()


def test_the_benchmarks_play_ids_are_those_of_the_whole_play(tokenizer: Any) -> None:
    sys.path.append(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import llm  # benchmarks/llm.py: not a package, found through sys.path
    finally:
        sys.path.pop()
    play = english_like(30_000, seed=5)
    text = play[len(play) // 3 :]  # the benchmark skips the first third
    whole = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids[0]
    assert llm.play_ids(tokenizer, text, 16, 512).tolist() == whole[: 16 * 512].reshape(16, 512).tolist()


def test_a_20_mb_text_is_read_and_tokenised_only_as_far_as_needed(tokenizer: Any, tmp_path: Path) -> None:
    block = english_like(20_000, seed=6)
    path = tmp_path / "big.txt"
    with path.open("w", encoding="utf-8") as handle:
        while handle.tell() < 20_000_000:
            handle.write(block)
    counting = Counting(tokenizer)
    with TextFile(path) as text:
        ids = first_token_ids(counting, text, 64 * 256)
        read = text.chars_read
    assert len(ids) == 64 * 256
    assert read < 1_000_000  # of 20 million: the prefixes double from about 6 characters per token
    assert counting.chars < 2 * read and counting.calls <= 4
    assert ids == tokenizer(block * 3)["input_ids"][: 64 * 256]


def test_a_short_text_is_tokenised_once_and_whole(tokenizer: Any) -> None:
    counting = Counting(tokenizer)
    text = english_like(100)
    assert first_token_ids(counting, text, 10_000) == tokenizer(text)["input_ids"]
    assert (counting.calls, counting.chars) == (1, len(text))


def test_prefixes_double_until_one_holds_the_margin_beyond_the_tokens_kept(tokenizer: Any) -> None:
    counting = Counting(tokenizer)
    text = english_like(20_000, seed=7)
    first_token_ids(counting, text, 5000)
    lengths = counting.lengths
    assert all(b == 2 * a for a, b in itertools.pairwise(lengths))
    assert len(tokenizer(text[: lengths[-1]])["input_ids"]) >= 5000 + MARGIN
    assert len(lengths) == 1 or len(tokenizer(text[: lengths[-2]])["input_ids"]) < 5000 + MARGIN


@pytest.mark.parametrize("special", [True, False])
def test_a_whole_text_is_tokenised_a_window_at_a_time_into_the_whole_texts_ids(tokenizer: Any, special: bool) -> None:
    text = english_like(30_000, seed=8) + "é€😀 " * 50 + english_like(1000, seed=9)  # multi-byte characters too
    counting = Counting(tokenizer)
    ids = all_token_ids(counting, text, add_special_tokens=special, window=5000)
    assert ids.tolist() == tokenizer(text, add_special_tokens=special)["input_ids"]
    assert counting.calls > len(text) // 5000 and max(counting.lengths) <= 5000 + 1250


class _PositionalTokenizer:
    """A 'fast' tokenizer whose ids depend on where a character sits in the call: no two windows agree."""

    is_fast = True

    def __call__(self, text: str, add_special_tokens: bool = True, **options: Any) -> dict[str, Any]:
        ids = [(ord(c) + i) % 50 for i, c in enumerate(text)]
        return {"input_ids": ids, "offset_mapping": [(i, i + 1) for i in range(len(text))]}


def test_windows_whose_seams_disagree_give_way_to_the_whole_text() -> None:
    text = english_like(3000, seed=10)
    ids = all_token_ids(_PositionalTokenizer(), text, window=1000)
    assert ids.tolist() == _PositionalTokenizer()(text)["input_ids"]


# -- what is refused -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("dense")
    save_tiny_llama_folder(folder)
    return folder


def _oneshot(model_dir: Path, tmp_path: Path, *extra: str) -> Any:
    args = [
        "oneshot", str(model_dir), str(tmp_path / "pruned"), "--method", "magnitude", "--samples", "2",
        "--seq-len", "8", *extra,
    ]  # fmt: skip
    return CliRunner().invoke(main, args, prog_name="prunereg")


@pytest.mark.parametrize("flag", ["--calibration", "--eval"])
def test_a_fifo_as_a_text_is_refused_in_one_line_without_blocking(model_dir: Path, tmp_path: Path, flag: str) -> None:
    fifo = tmp_path / "text.txt"
    os.mkfifo(fifo)
    (tmp_path / "calibration.txt").write_text(english_like(200))
    texts = {"--calibration": fifo, "--eval": tmp_path / "calibration.txt"}
    if flag == "--eval":
        texts = {"--calibration": tmp_path / "calibration.txt", "--eval": fifo}
    with fifo_unblocker(fifo):
        result = _oneshot(model_dir, tmp_path, *(a for k, v in texts.items() for a in (k, str(v))))
    assert result.exit_code == 1, result.output
    assert result.stderr == f"Error: '{fifo}' is a FIFO (named pipe), not a regular file; give the text file itself\n"
    assert not (tmp_path / "pruned").exists()


def test_dev_zero_as_a_text_is_refused_unread(model_dir: Path, tmp_path: Path) -> None:
    device = tmp_path / "zero.txt"
    device.symlink_to("/dev/zero")
    result = _oneshot(model_dir, tmp_path, "--calibration", str(device))
    assert result.exit_code == 1, result.output
    assert result.stderr == f"Error: '{device}' is a character device, not a regular file; give the text file itself\n"


def test_a_text_that_is_not_utf8_is_named_in_one_line(model_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes("w1 w2 caf\xe9 w3".encode("latin-1"))
    result = _oneshot(model_dir, tmp_path, "--calibration", str(path))
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"Error: '{path}' is not UTF-8 text (invalid continuation byte: byte 0xe9); save it as UTF-8\n"
    )


def test_a_text_too_short_names_the_flags(model_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "short.txt"
    path.write_text("w1 w2 w3")
    result = _oneshot(model_dir, tmp_path, "--calibration", str(path))
    assert result.exit_code == 1, result.output
    assert result.stderr == f"Error: '{path}' has 3 tokens; --samples 2 x --seq-len 8 needs 16\n"


def test_a_tokenizer_beyond_the_models_vocabulary_is_one_line_before_pruning(model_dir: Path, tmp_path: Path) -> None:
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path / "mismatched"
    shutil.copytree(model_dir, folder)
    words = [f"v{i}" for i in range(200)]  # the model embeds 64 tokens
    backend = Tokenizer(models.WordLevel({"[UNK]": 0, **{w: i for i, w in enumerate(words, 1)}}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]").save_pretrained(folder)
    (tmp_path / "calibration.txt").write_text(" ".join(reversed(words)))
    result = _oneshot(folder, tmp_path, "--calibration", str(tmp_path / "calibration.txt"))
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        "Error: the calibration samples hold the token id 200, but the model's vocabulary has 64 tokens (ids 0 to "
        "63); tokenise with the model's own tokenizer\n"
    )
    assert not (tmp_path / "pruned").exists()
