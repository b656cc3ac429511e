"""The ranks of the data-parallel calibration tests: one-shot, shrink and recovery runs on tiny models, over gloo.

``calibration_ranks.py RESULTS WORLD_SIZE``: distributed_worker.py's launcher and
result files (``RESULTS.<rank>``, JSON), running the cases below instead of its
own. A run's result is a hash of every tensor of the model after it and how
many calibration batches this rank ran through the model, so that the tests
compare each rank with one process over all the samples, bit for bit.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import prunereg
from prunereg import LayerStatistics, PrunedWeight, RecoveryBlock, RecoveryMethod
from prunereg_shrink.methods import WandaSP
from tests.support.tiny_lm import NormScore, calibration_ids, random_text, save_tiny_llama_folder, tiny_llama

#: name -> the method and the settings of a one-shot run (7 samples: batches that 2 and 3 ranks split unevenly).
ONESHOT_RUNS: dict[str, tuple[str, dict[str, Any]]] = {
    "wanda": ("wanda", {"sparsity": 0.5, "batch_size": 2}),
    "sparsegpt": ("sparsegpt", {"sparsity": 0.5, "batch_size": 1}),
    "sparsegpt_2_4": ("sparsegpt", {"pattern": "2:4", "batch_size": 3}),
    "wanda_owl": ("wanda", {"sparsity": 0.6, "allocation": "owl", "owl_lambda": 0.1, "batch_size": 1}),
    "wanda_mixtral": ("wanda", {"sparsity": 0.5, "batch_size": 1}),  # experts some ranks' tokens never reach
}


#: name -> the method and the settings of a shrink run, on the same samples.
SHRINK_RUNS: dict[str, tuple[str, dict[str, Any]]] = {
    "flap": ("flap", {"mlp": 0.5, "heads": 0.5, "batch_size": 1}),
    "flap_global": ("flap", {"mlp": 0.5, "heads": 0.5, "allocation": "global", "batch_size": 2}),
    "wanda_sp": ("wanda_sp", {"mlp": 0.25, "batch_size": 1}),
    "block_influence": ("block_influence", {"layers": 1, "batch_size": 1}),
    "reap_mixtral": ("reap", {"experts": 0.5, "batch_size": 1}),
    "flap_refit": ("flap", {"mlp": 0.5, "heads": 0.5, "batch_size": 1, "recover": "refit"}),
    "wanda_sp_refit": ("wanda_sp", {"mlp": 0.25, "batch_size": 2, "recover": "refit"}),
}

#: name -> how the student is made from the dense model (a shrink or one-shot run alone, and what it removed),
#: then the recovery method and its settings, on the same samples.
RECOVER_RUNS: dict[str, tuple[str, dict[str, Any], str, dict[str, Any]]] = {
    "refit": ("flap", {"mlp": 0.5, "heads": 0.5}, "refit", {"batch_size": 1}),
    "replace": ("drop", {"block": 1}, "replace", {"batch_size": 2}),  # a span after a kept block, to fold into
    "refit_masked": ("wanda", {"sparsity": 0.5}, "refit", {"batch_size": 1}),
}

#: The runs on a mixture of experts (the others run on a three-block Llama).
ON_MIXTRAL = {"wanda_mixtral", "reap_mixtral"}


def state_digest(model: nn.Module) -> str:
    """A hash of every tensor of ``model``'s state dict, names, dtypes and bytes (equal hashes: equal bits).

    A sharded (DTensor) tensor counts whole: gathering it is a collective, which every rank must make.
    """
    hashed = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        hashed.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}".encode())
        hashed.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return hashed.hexdigest()


def folder_digest(folder: Path) -> str:
    """A hash of every tensor in the safetensors files of ``folder``, by name (how they are sharded aside)."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(path))
    model = nn.Module()
    for index, name in enumerate(sorted(tensors)):
        model.register_buffer(f"t{index}", tensors[name])
    return state_digest(model) + " " + ",".join(sorted(tensors))


def saved_source(work: Path) -> Path:
    """``work/source``: a tiny Llama folder (and a calibration text) rank 0 (or the one process) saves, all wait."""
    source = work / "source"
    if not dist_rank():
        save_tiny_llama_folder(source)
        (work / "calibration.txt").write_text(random_text(200))
    if dist_rank() is not None:
        import torch.distributed as dist

        dist.barrier()
    return source


def run_oneshot_folder(work: Path) -> str:
    """``oneshot_folder`` of a tiny Llama folder in ``work`` into ``work/pruned`` (rank 0 saves the source first)."""
    source, output = saved_source(work), work / "pruned"
    prunereg.oneshot_folder(source, output, "sparsegpt", calibration=calibration_ids(7, 16), batch_size=1)
    return folder_digest(output)


#: name -> the settings of a streamed shrink run (``shrink_folder``) with its recovery, on 7 samples.
STREAMED_SHRINK_RUNS: dict[str, dict[str, Any]] = {
    "flap_refit": {"mlp": 0.5, "heads": 0.5, "recover": "refit", "batch_size": 1},
    "wanda_sp_steps": {"mlp": 0.5, "steps": 2, "recover": "refit", "batch_size": 2},
}


def run_shrink_folder(work: Path, name: str, *, in_memory: bool = False) -> dict[str, object]:
    """``shrink_folder`` run ``name`` of a tiny Llama folder in ``work`` into ``work/shrunk``, or (``in_memory``)
    ``shrink`` of the model loaded from it, saved there: the folder's hash and the folders left in ``work``."""
    from transformers import AutoModelForCausalLM

    settings = dict(STREAMED_SHRINK_RUNS[name])
    method = "wanda_sp" if "steps" in settings else "flap"
    source, output = saved_source(work), work / "shrunk"
    if in_memory:
        model = AutoModelForCausalLM.from_pretrained(source).eval()
        prunereg.shrink(model, method, calibration_ids(7, 16), **settings)
        model.save_pretrained(output)
    else:
        prunereg.shrink_folder(source, output, method, calibration_ids(7, 16), **settings)
    return {"folder": folder_digest(output), "entries": sorted(path.name for path in work.iterdir() if path.is_dir())}


class FailsOnRankOneSecondBlock(WandaSP):
    """Wanda-sp that raises on rank 1 at its second block, after every rank cut (and rank 0 wrote) the first."""

    def __init__(self) -> None:
        self.blocks = 0

    def channel_scores(self, weight: torch.Tensor, statistics: Any) -> torch.Tensor:
        self.blocks += 1
        if dist_rank() == 1 and self.blocks > 1:
            raise RuntimeError("rank one's method broke")
        return super().channel_scores(weight, statistics)


def shrink_folder_when_a_rank_raises(work: Path) -> dict[str, object]:
    """Rank 1 raises midway through ``shrink_folder``: every rank stops with one error and no output folder."""
    source = saved_source(work)
    try:
        prunereg.shrink_folder(source, work / "shrunk", FailsOnRankOneSecondBlock(), calibration_ids(7, 16), mlp=0.5)
    except Exception as error:
        import torch.distributed as dist

        dist.barrier()  # every rank has stopped (and rank 0 cleaned up) before any looks
        left = sorted(path.name for path in work.iterdir())
        return {"error": type(error).__name__, "message": str(error), "left": left}
    return {"error": None}


def shrink_arguments(work: Path, *flags: str) -> list[str]:
    """The ``prunereg shrink`` arguments of :func:`run_command` (``work``'s source into ``work/pruned``)."""
    source, output, text = work / "source", work / "pruned", work / "calibration.txt"
    return [
        "shrink", str(source), str(output), "-m", "flap", "--mlp", "0.5", "--heads", "0.5", "--recover", "refit",
        "--calibration", str(text), "--samples", "7", "--seq-len", "16", "--batch-size", "1", "--quiet", *flags,
    ]  # fmt: skip


def oneshot_arguments(work: Path, *flags: str) -> list[str]:
    """The ``prunereg oneshot`` arguments of :func:`run_oneshot_command` (``work``'s source into ``work/pruned``)."""
    source, output, text = work / "source", work / "pruned", work / "calibration.txt"
    return [
        "oneshot", str(source), str(output), "-m", "sparsegpt", "--calibration", str(text), "--samples", "7",
        "--seq-len", "16", "--batch-size", "1", "--quiet", *flags,
    ]  # fmt: skip


def run_oneshot_command(work: Path, *flags: str) -> dict[str, object]:
    """``prunereg oneshot`` of a tiny Llama folder in ``work`` into ``work/pruned``: :func:`run_command`."""
    return run_command(work, oneshot_arguments(work, *flags))


def run_command(work: Path, arguments: list[str]) -> dict[str, object]:
    """A ``prunereg`` command (click's runner) on ``work``'s tiny Llama folder, written into ``work/pruned``.

    Rank 0 (or the one process) saves the source folder and calibration text
    first; the result is the exit code, the output folder's hash and the command's output.
    """
    from click.testing import CliRunner

    from prunereg._cli.app import main

    saved_source(work)
    output = work / "pruned"
    result = CliRunner().invoke(main, arguments)
    written = output.is_dir()
    return {"code": result.exit_code, "folder": folder_digest(output) if written else None, "output": result.output}


def under_torchrun(arguments: list[str], n_ranks: int = 2) -> subprocess.CompletedProcess[str]:
    """The installed ``prunereg`` command with ``arguments``, started by ``torchrun`` on ``n_ranks`` local ranks."""
    command = str(Path(sys.executable).with_name("prunereg"))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n_ranks)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(
        [*torchrun, "--no-python", command, *arguments], env=env, capture_output=True, text=True, timeout=300
    )


def dist_rank() -> int | None:
    """This process's rank, or None outside torch.distributed."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else None


def oneshot_folder_written_by_rank_zero() -> dict[str, object]:
    """Every rank calls oneshot_folder; rank 0 writes it, and each finds it complete when the call returns."""
    work = Path(sys.argv[1]).parent
    digest = run_oneshot_folder(work)
    return {"folder": digest, "entries": sorted(path.name for path in work.iterdir() if path.is_dir())}


def counting_batches(model: nn.Module) -> list[int]:
    """A list that grows by one for every batch ``model``'s embedding reads."""
    seen: list[int] = []
    model.get_input_embeddings().register_forward_hook(lambda *_: seen.append(1))
    return seen


def fresh_model(run: str) -> nn.Module:
    """The model ``run`` starts from: a tiny Mixtral or a three-block tiny Llama."""
    from tests.shrink.models import tiny_mixtral

    return tiny_mixtral() if run in ON_MIXTRAL else tiny_llama(layers=3)


@contextlib.contextmanager
def counting_calls(owner: object, name: str) -> Iterator[list[int]]:
    """A list that grows by one for every call of ``owner.name`` here (a class's method, a module's function)."""
    original = getattr(owner, name)
    called: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        called.append(1)
        return original(*args, **kwargs)

    setattr(owner, name, counted)
    try:
        yield called
    finally:
        setattr(owner, name, original)


def run_oneshot(name: str) -> dict[str, object]:
    """One-shot run ``name`` on a fresh tiny Llama: the model's hash, the batches and the groups this process solved,
    and the most payloads of other ranks held whole at once in a merge of statistics (:func:`whole_payloads_in_merges`).
    """
    method, settings = ONESHOT_RUNS[name]
    model = fresh_model(name)
    seen = counting_batches(model)
    with counting_calls(prunereg.get(method), "prune_group") as solved, whole_payloads_in_merges() as whole:
        prunereg.oneshot(model, method, calibration=calibration_ids(7, 16), **settings)
    held = {
        "merge_loads": len(whole),
        "most_whole": max(whole, default=0),
        "own_statistics_alive": max(whole.own_alive, default=0),
        "own_statistics_tracked": min(whole.own_tracked, default=0),
    }
    return {"state": state_digest(model), "batches": len(seen), "solves": len(solved), **held}


def tensors_in(found: object, seen: set[int] | None = None) -> list[torch.Tensor]:
    """Every tensor reachable from ``found`` through tuples, lists, dicts and objects' attributes."""
    seen = set() if seen is None else seen
    if id(found) in seen:
        return []
    seen.add(id(found))
    if isinstance(found, torch.Tensor):
        return [found]
    if isinstance(found, dict):
        inside: list[object] = [*found.keys(), *found.values()]
    elif isinstance(found, (tuple, list)):
        inside = list(found)
    else:
        inside = list(getattr(found, "__dict__", {}).values())
    return [tensor for each in inside for tensor in tensors_in(each, seen)]


@contextlib.contextmanager
def whole_payloads_in_merges() -> Iterator[WholeCounts]:
    """At each rank's payload that ``Ranks.merge`` loads (``torch.load``): how many loaded before it, in that merge,
    still hold every one of their tensors (a list, one count per load).

    A payload combined into the statistics loses the partials that were
    combined into another's; one left whole is held entire. Rank 0's stays
    whole, as the partials the later ones are combined into: a merge that
    holds one other rank's payload at a time counts 1 at most, one that loads
    every rank's before combining counts every earlier one.
    """
    from prunereg._runtime.ranks import Ranks

    load, merge = torch.load, Ranks.merge
    merges: list[list[list[weakref.ref[torch.Tensor]]]] = []  # per merge under way, each load's tensors
    own: list[list[weakref.ref[torch.Tensor]]] = []  # per merge under way, the recorder's own statistics' tensors
    counts = WholeCounts()

    def counted_load(*args: Any, **kwargs: Any) -> Any:
        if not merges:
            return load(*args, **kwargs)
        counts.append(sum(all(ref() is not None for ref in refs) for refs in merges[-1] if refs))
        counts.own_alive.append(sum(ref() is not None for ref in own[-1]))
        loaded = load(*args, **kwargs)
        merges[-1].append([weakref.ref(tensor) for tensor in tensors_in(loaded)])
        return loaded

    def counted_merge(self: Ranks, recorder: Any) -> None:
        merges.append([])
        own.append([weakref.ref(t) for t in tensors_in((recorder.tallies, recorder.called, recorder.block))])
        counts.own_tracked.append(len(own[-1]))
        try:
            merge(self, recorder)
        finally:
            merges.pop()
            own.pop()

    torch.load, Ranks.merge = counted_load, counted_merge  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        torch.load, Ranks.merge = load, merge  # type: ignore[method-assign]


class WholeCounts(list[int]):
    """:func:`whole_payloads_in_merges`'s counts; and, for this rank's own statistics (the recorder's tensors before
    the merge), how many each merge tracked (``own_tracked``) and how many were alive at each load (``own_alive``)."""

    def __init__(self) -> None:
        super().__init__()
        self.own_tracked: list[int] = []
        self.own_alive: list[int] = []


class PrunesMoreOnLaterRanks(NormScore):
    """Prunes a higher share of each row on each later rank: the ranks' models agree only if each takes the solver's."""

    def prune_group(
        self, weights: Any, statistics: LayerStatistics, sparsities: Any
    ) -> list[PrunedWeight]:  # fmt: skip
        more = [s + 0.125 * (dist_rank() or 0) for s in sparsities]
        return super().prune_group(weights, statistics, more)


def solved_by_one_rank() -> dict[str, object]:
    """A method that prunes differently on every rank: the model's hash and how many groups this rank solved."""
    model = tiny_llama()
    method = PrunesMoreOnLaterRanks(0.25)
    prunereg.oneshot(model, method, calibration=calibration_ids(7, 16), batch_size=2)
    return {"state": state_digest(model), "solves": len(method.calls)}


def run_shrink(name: str) -> dict[str, object]:
    """Shrink run ``name`` on a fresh tiny Llama: the model's hash and the batches this process ran."""
    method, settings = SHRINK_RUNS[name]
    model = fresh_model(name)
    seen = counting_batches(model)
    prunereg.shrink(model, method, calibration_ids(7, 16), **settings)
    return {"state": state_digest(model), "batches": len(seen)}


def shrunk_or_pruned(name: str) -> tuple[nn.Module, dict[str, Any]]:
    """A fresh tiny Llama as recovery run ``name`` (of :data:`RECOVER_RUNS`) starts from, made in this process
    alone, and the blocks its shrink removed (``removed_blocks=``), if any."""
    make, made_with, _, _ = RECOVER_RUNS[name]
    model = fresh_model(name)
    if make == "drop":  # one block taken out by hand, as shrinking's layers= takes blocks out
        del model.model.layers[made_with["block"]]
        for index, block in enumerate(model.model.layers):  # numbered again, as shrinking does: the cache reads it
            block.self_attn.layer_idx = index
        model.config.num_hidden_layers -= 1
        if getattr(model.config, "layer_types", None):
            del model.config.layer_types[made_with["block"]]
        return model, {"removed_blocks": [made_with["block"]]}
    if make == "wanda":
        prunereg.oneshot(model, make, calibration=calibration_ids(7, 16), data_parallel=False, **made_with)
        return model, {}
    report = prunereg.shrink(model, make, calibration_ids(7, 16), data_parallel=False, **made_with)
    return model, {"removed_blocks": report.removed_blocks} if report.removed_blocks else {}


def run_recover(name: str) -> dict[str, object]:
    """Recovery run ``name``: a fresh tiny Llama shrunk or pruned alone, then recovered.

    Its hash, the batches it ran and the masked rows' solves it made (``torch.linalg.solve`` calls).
    """
    _, _, method, settings = RECOVER_RUNS[name]
    teacher = fresh_model(name)
    model, removed = shrunk_or_pruned(name)
    calibration = calibration_ids(7, 16)
    seen = counting_batches(model)
    with counting_calls(torch.linalg, "solve") as solved:  # a refit on a masked model: one per distinct row mask
        prunereg.recover(model, teacher, calibration, method, **removed, **settings)
    return {"state": state_digest(model), "batches": len(seen), "solves": len(solved)}


class ReadsItsOwnShare(RecoveryMethod):
    """Claims DATA_PARALLEL but writes how many batches this rank holds into a bias: too small to change a loss."""

    DATA_PARALLEL = True

    @property
    def writer_biases(self) -> frozenset[str]:
        return frozenset({"mlp"})

    def recover_block(self, block: RecoveryBlock) -> str | None:
        writer = block.writer("mlp")
        assert writer is not None and isinstance(writer.bias, torch.Tensor)
        with torch.no_grad():
            writer.bias[0] = 1e-30 * block.n_batches  # 3 and 4 of 7 batches at 2 ranks
        return None


def error_and_unchanged(run: Callable[[nn.Module], object]) -> dict[str, object]:
    """``run`` on a tiny Llama, which every rank refuses or stops on: the error, and whether the model is unchanged."""
    model = tiny_llama(layers=3)
    before = state_digest(model)
    try:
        run(model)
    except Exception as error:
        return {"error": type(error).__name__, "message": str(error), "unchanged": state_digest(model) == before}
    return {"error": None}


def refused_when_ranks_disagree() -> dict[str, object]:
    """Rank 1 asks for another sparsity: every rank is refused, its model unchanged."""
    import torch.distributed as dist

    model = tiny_llama()
    before = state_digest(model)
    sparsity = 0.6 if dist.get_rank() == 1 else 0.5
    try:
        prunereg.oneshot(model, "wanda", calibration=calibration_ids(7, 16), sparsity=sparsity)
    except Exception as error:
        return {"error": type(error).__name__, "message": str(error), "unchanged": state_digest(model) == before}
    return {"error": None}


def at_second_block(method: NormScore, weights: Any) -> bool:
    """Whether ``method``, called with ``weights``, is at this rank's first group of the second block.

    Each rank solves its own share of a block's groups: the first group it
    solved comes again, with the same shapes, in the next block.
    """
    return bool(method.calls) and [w.shape for w in weights] == [w.shape for w in method.calls[0][0]]


class FailsOnRankOne(NormScore):
    """Raises on rank 1 at its first group of the second block, after every rank wrote the first block."""

    def prune_group(
        self, weights: Any, statistics: LayerStatistics, sparsities: Any
    ) -> list[PrunedWeight]:  # fmt: skip
        if dist_rank() == 1 and at_second_block(self, weights):
            raise RuntimeError("rank one's method broke")
        return super().prune_group(weights, statistics, sparsities)


class DiesOnRankOne(NormScore):
    """Ends rank 1's process at its first group of the second block, without a word to the other ranks."""

    def prune_group(
        self, weights: Any, statistics: LayerStatistics, sparsities: Any
    ) -> list[PrunedWeight]:  # fmt: skip
        if dist_rank() == 1 and at_second_block(self, weights):
            os._exit(7)
        return super().prune_group(weights, statistics, sparsities)


def oneshot_folder_when_a_rank_dies() -> dict[str, object]:
    """Rank 1 dies midway through ``oneshot_folder``: rank 0 stops with an error and leaves no output folder."""
    import torch.distributed as dist

    work = Path(sys.argv[1]).parent
    source, output = work / "source", work / "pruned"
    if dist.get_rank() == 0:
        save_tiny_llama_folder(source)
    dist.barrier()
    try:
        prunereg.oneshot_folder(source, output, DiesOnRankOne(0.5), calibration=calibration_ids(7, 16), batch_size=1)
    except Exception as error:
        return {"error": type(error).__name__, "left": sorted(path.name for path in work.iterdir() if path.is_dir())}
    return {"error": None}


def combine_raises_on_rank_one(model: nn.Module) -> None:
    """SparseGPT on ``model``, rank 1's combine of the ranks' statistics raising at the first rank's partials:
    it must still take part in the other ranks' broadcasts (its own among them), or they wait for it forever."""
    from prunereg._runtime.recorder import Tally

    extend = Tally.extend

    def broken(self: Tally, n_tokens: int, spans: list[Any]) -> None:
        if dist_rank() == 1:
            raise RuntimeError("rank one's combine broke")
        extend(self, n_tokens, spans)

    Tally.extend = broken  # type: ignore[method-assign]
    try:
        prunereg.oneshot(model, "sparsegpt", calibration=calibration_ids(7, 16), batch_size=1)
    finally:
        Tally.extend = extend  # type: ignore[method-assign]


def one_rank_raises() -> dict[str, object]:
    """Rank 1's method raises midway: every rank stops with one error, its model as it was."""
    model = tiny_llama()
    before = state_digest(model)
    try:
        prunereg.oneshot(model, FailsOnRankOne(0.5), calibration=calibration_ids(7, 16))
    except Exception as error:
        return {"error": type(error).__name__, "message": str(error), "unchanged": state_digest(model) == before}
    return {"error": None}


#: The one-shot runs (of :data:`ONESHOT_RUNS`) also made on a tiny Llama sharded with FSDP2.
FSDP_RUNS = ("wanda", "sparsegpt", "sparsegpt_2_4", "wanda_owl", "wanda_mixtral")


def fully_sharded(
    model: nn.Module, mesh_shape: tuple[int, ...] | None = None, *, reshard_after_forward: bool = True
) -> nn.Module:
    """``model`` sharded with FSDP2's standard recipe: ``fully_shard`` on each decoder block, then on the root.

    On a 1-D mesh of every rank, or one of ``mesh_shape`` (2-D: HSDP).
    ``reshard_after_forward`` is the blocks' (False: they keep their gathered parameters after a forward).
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    shape = mesh_shape or (dist.get_world_size(),)
    names = ("replicate", "shard")[-len(shape) :]
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    for block in model.model.layers:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh)
    return model


def shards_digest(model: nn.Module) -> str:
    """A hash of this rank's own shards of ``model``'s parameters (local, no collective)."""
    shards = nn.Module()
    for index, (_, parameter) in enumerate(model.named_parameters()):
        shards.register_buffer(f"t{index}", parameter.to_local() if isinstance(parameter, DTensor) else parameter)
    return state_digest(shards)


def run_fsdp_oneshot(name: str) -> dict[str, object]:
    """One-shot run ``name`` on a tiny Llama (or Mixtral, its experts fused) sharded with FSDP2, on every rank.

    The model's hash (whole), the batches this rank ran, whether this rank's
    shards are those of the same run in one process on the unsharded model
    (cut with ``torch.chunk``, as FSDP2 shards dim 0), and whether the sharded
    model's forward then gives that model's logits.
    """
    method, settings = ONESHOT_RUNS[name]
    calibration = calibration_ids(7, 16)
    alone = fresh_model(name)
    prunereg.oneshot(alone, method, calibration=calibration, data_parallel=False, **settings)
    model = fresh_model(name)
    seen = counting_batches(model)
    prunereg.oneshot(fully_sharded(model), method, calibration=calibration, **settings)
    batches = len(seen)  # (before the forward below)
    own_shards, logits = shards_and_logits_of(model, alone, calibration)
    return {"state": state_digest(model), "batches": batches, "own_shards": own_shards, "logits": logits}


def fsdp_shard(whole: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Rank ``rank``'s shard of ``whole`` as FSDP2 cuts dim 0 (``torch.chunk``: a rank past the chunks holds none)."""
    chunks = torch.chunk(whole, size)
    return chunks[rank] if rank < len(chunks) else whole[:0]


def shards_and_logits_of(model: nn.Module, alone: nn.Module, ids: torch.Tensor) -> tuple[bool, bool]:
    """Whether this rank's shards of ``model`` are ``alone``'s parameters cut as FSDP2 cuts dim 0, and whether the
    sharded model's forward on ``ids`` gives ``alone``'s logits."""
    import torch.distributed as dist

    whole = dict(alone.named_parameters())
    rank, size = dist.get_rank(), dist.get_world_size()
    own_shards = all(
        torch.equal(parameter.to_local(), fsdp_shard(whole[name], rank, size))
        for name, parameter in model.named_parameters()
    )
    with torch.no_grad():
        logits = torch.equal(model(ids).logits, alone(ids).logits)
    return own_shards, logits


def fsdp_masks() -> dict[str, object]:
    """``permanent=False`` on an FSDP2 Llama: each rank's masks and weights against one process's, and after remove.

    Whether every mask and ``weight_orig`` (whole) and this rank's shards of
    them are those of the same run in one process on the unsharded model,
    whether the masks are DTensors laid out like their weights, and whether
    the forward after ``prunereg.remove`` gives that model's logits.
    """
    import torch.distributed as dist

    calibration = calibration_ids(7, 16)
    alone = tiny_llama(layers=3)
    prunereg.oneshot(alone, "sparsegpt", calibration=calibration, batch_size=1, permanent=False, data_parallel=False)
    model = fully_sharded(tiny_llama(layers=3))
    prunereg.oneshot(model, "sparsegpt", calibration=calibration, batch_size=1, permanent=False)
    expected = {**dict(alone.named_parameters()), **dict(alone.named_buffers())}
    found = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    masks = {name: tensor for name, tensor in found.items() if name.endswith("weight_mask")}
    rank, size = dist.get_rank(), dist.get_world_size()
    sharded = [name for name, tensor in found.items() if isinstance(tensor, DTensor)]
    same = sorted(found) == sorted(expected) and all(
        torch.equal(found[name].full_tensor(), expected[name]) for name in sharded
    )
    own_shards = all(torch.equal(found[name].to_local(), fsdp_shard(expected[name], rank, size)) for name in sharded)
    laid_out = bool(masks) and all(
        isinstance(mask, DTensor) and mask.placements == found[name[: -len("mask")] + "orig"].placements
        for name, mask in masks.items()
    )
    for each in (alone, model):
        for module in each.modules():
            if hasattr(module, "weight_orig"):
                prunereg.remove(module, "weight")
    with torch.no_grad():
        logits = torch.equal(model(calibration).logits, alone(calibration).logits)
    return {"same": same, "own_shards": own_shards, "masks": len(masks), "laid_out": laid_out, "logits": logits}


#: Which decoder blocks held whole (gathered) parameters at each of :class:`SeesGatheredBlocks`' solves.
GATHERED_AT_SOLVES: list[list[int]] = []


class SeesGatheredBlocks(NormScore):
    """Notes, at each solve, which blocks of :data:`WATCHED_BLOCKS` hold whole parameters, not shards."""

    def prune_group(
        self, weights: Any, statistics: LayerStatistics, sparsities: Any
    ) -> list[PrunedWeight]:  # fmt: skip
        GATHERED_AT_SOLVES.append(
            [
                index
                for index, block in enumerate(WATCHED_BLOCKS)
                if not any(isinstance(parameter, DTensor) for parameter in block.parameters())
            ]
        )
        return super().prune_group(weights, statistics, sparsities)


#: The blocks :class:`SeesGatheredBlocks` looks at.
WATCHED_BLOCKS: list[nn.Module] = []


def fsdp_gathered_one_block_at_a_time() -> dict[str, object]:
    """One-shot on an FSDP2 Llama whose blocks kept their gathered parameters after a forward.

    What was whole at each solve, the gathers made, whether all is sharded
    after, and whether the forward then gives the logits of the same run in
    one process on the unsharded model.
    """
    calibration = calibration_ids(7, 16)
    alone = tiny_llama(layers=3)
    prunereg.oneshot(alone, NormScore(0.5), calibration=calibration, batch_size=2, data_parallel=False)
    model = fully_sharded(tiny_llama(layers=3), reshard_after_forward=False)
    with torch.no_grad():
        model(calibration)  # the blocks now hold their parameters gathered, as plain tensors
    WATCHED_BLOCKS[:] = list(model.model.layers)
    GATHERED_AT_SOLVES.clear()
    with counting_calls(DTensor, "full_tensor") as gathers:
        prunereg.oneshot(model, SeesGatheredBlocks(0.5), calibration=calibration, batch_size=2)
    n_gathers = len(gathers)
    sharded_after = all(isinstance(parameter, DTensor) for parameter in model.parameters())
    with torch.no_grad():
        logits = torch.equal(model(calibration).logits, alone(calibration).logits)
    return {
        "whole_at_solves": list(GATHERED_AT_SOLVES),
        "gathers": n_gathers,
        "parameters": len(list(model.parameters())),
        "sharded_after": sharded_after,
        "logits": logits,
    }


def fsdp_one_rank_raises() -> dict[str, object]:
    """Rank 1's method raises at the second block of an FSDP2 Llama: every rank's error, and its model after.

    Whether its shards are as before the call, every parameter sharded again,
    and the forward that of the model never pruned (FSDP2's hooks back).
    """
    calibration = calibration_ids(7, 16)
    model = fully_sharded(tiny_llama())
    before = shards_digest(model)
    try:
        prunereg.oneshot(model, FailsOnRankOne(0.5), calibration=calibration)
    except Exception as error:
        found: dict[str, object] = {"error": type(error).__name__, "message": str(error)}
    else:
        return {"error": None}
    found["unchanged"] = shards_digest(model) == before
    found["sharded"] = all(isinstance(parameter, DTensor) for parameter in model.parameters())
    with torch.no_grad():
        found["logits"] = torch.equal(model(calibration).logits, tiny_llama()(calibration).logits)
    return found


def fsdp_rank_raises_after_writing_a_block() -> dict[str, object]:
    """Rank 1 raises after writing its second block, before giving it back: every rank's error and shards after."""
    import prunereg._oneshot.engine as engine

    calibration = calibration_ids(7, 16)
    model = fully_sharded(tiny_llama(layers=3))
    before = shards_digest(model)
    advance = engine.advance
    advanced: list[int] = []

    def advance_then_fail(block: nn.Module, inputs: Any) -> None:
        advanced.append(1)
        if dist_rank() == 1 and len(advanced) == 2:  # block 1, whose pruned values are written by now
            raise RuntimeError("rank one broke after writing a block")
        advance(block, inputs)

    engine.advance = advance_then_fail
    try:
        prunereg.oneshot(model, "sparsegpt", calibration=calibration, batch_size=1)
    except Exception as error:
        found: dict[str, object] = {"error": type(error).__name__}
    else:
        return {"error": None}
    finally:
        engine.advance = advance
    found["unchanged"] = shards_digest(model) == before
    found["sharded"] = all(isinstance(parameter, DTensor) for parameter in model.parameters())
    return found


#: A refused run: how to make its model, and the call on it.
Refusal = tuple[Callable[[], nn.Module], Callable[[nn.Module], object]]


def check_refusals(per_rank: list[Any], expected: dict[str, tuple[str, str]]) -> None:
    """Each rank's :func:`refusals`: per run, the error type and the start of its one-line message; shards unchanged."""
    for found in per_rank:
        for name, (error, start) in expected.items():
            assert found[name]["error"] == error, (name, found[name])
            assert found[name]["message"].startswith(start), found[name]["message"]
            assert "\n" not in found[name]["message"]
            assert found[name]["unchanged"], name


def refusals(runs: dict[str, Refusal]) -> dict[str, object]:
    """Each run's error (its type and message; None where it ran) and whether this rank's shards are unchanged."""
    found: dict[str, object] = {}
    for name, (make, run) in runs.items():
        model = make()
        before = shards_digest(model)
        try:
            run(model)
        except Exception as error:
            found[name] = {
                "error": type(error).__name__,
                "message": str(error),
                "unchanged": shards_digest(model) == before,
            }
        else:
            found[name] = {"error": None}
    return found


def fsdp_refused() -> dict[str, object]:
    """Each run prunereg refuses on a sharded model: its error, one line, and whether the shards are unchanged."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    def tensor_parallel() -> nn.Module:
        model = tiny_llama(layers=3)
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        layer = model.model.layers[1].mlp.up_proj
        layer.weight = nn.Parameter(distribute_tensor(layer.weight.detach(), mesh, [Shard(0)]))
        return model

    def grouped() -> nn.Module:
        from torch.distributed.fsdp import fully_shard

        model = tiny_llama(layers=3)
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        fully_shard([model.model.layers[0], model.model.layers[1]], mesh=mesh)  # two blocks, one call
        fully_shard(model, mesh=mesh)
        return model

    calibration = calibration_ids(7, 16)
    runs: dict[str, Refusal] = {
        "shrink": (
            lambda: fully_sharded(tiny_llama(layers=3)),
            lambda model: prunereg.shrink(model, "flap", calibration, mlp=0.5),
        ),
        "not_data_parallel": (
            lambda: fully_sharded(tiny_llama(layers=3)),
            lambda model: prunereg.oneshot(model, "wanda", calibration=calibration, data_parallel=False),
        ),
        "mesh_2d": (
            lambda: fully_sharded(tiny_llama(layers=3), (1, dist.get_world_size())),
            lambda model: prunereg.oneshot(model, "wanda", calibration=calibration),
        ),
        "grouped": (grouped, lambda model: prunereg.oneshot(model, "wanda", calibration=calibration)),
        "tensor_parallel": (
            tensor_parallel,
            lambda model: prunereg.oneshot(model, "sparsegpt", calibration=calibration),
        ),
    }
    return refusals(runs)


#: Recovery runs (of :data:`RECOVER_RUNS`) made with the model, and the teacher if ``True``, sharded with FSDP2;
#: no new biases (a sharded model cannot gain parameters), so ``bias=False`` where the method switches some on.
SHARDED_RECOVER_RUNS: dict[str, tuple[str, bool, dict[str, Any]]] = {
    "refit": ("refit", True, {"bias": False}),
    "refit_plain_teacher": ("refit", False, {"bias": False}),
    "replace": ("replace", True, {"bias": False}),
    "refit_masked": ("refit_masked", True, {"bias": False}),
}


def run_sharded_recover(name: str) -> dict[str, object]:
    """Recovery run ``name`` of :data:`SHARDED_RECOVER_RUNS` on every rank, against the same run in one process.

    Whether this rank's shards are that run's model's (cut as FSDP2 cuts dim 0),
    whether the sharded model's forward gives its logits, the teacher's shards
    unchanged, the batches this rank ran, and whether every parameter is sharded after.
    """

    run, shard_teacher, extra = SHARDED_RECOVER_RUNS[name]
    _, _, method, settings = RECOVER_RUNS[run]
    calibration = calibration_ids(7, 16)
    alone, removed = shrunk_or_pruned(run)
    prunereg.recover(alone, fresh_model(run), calibration, method, data_parallel=False, **removed, **settings, **extra)
    model, removed = shrunk_or_pruned(run)
    unrecovered = state_digest(model)
    teacher = fresh_model(run)
    if shard_teacher:
        teacher = fully_sharded(teacher)
    teacher_before = shards_digest(teacher)
    seen = counting_batches(model)
    prunereg.recover(fully_sharded(model), teacher, calibration, method, **removed, **settings, **extra)
    batches = len(seen)  # (before the forward below)
    own_shards, logits = shards_and_logits_of(model, alone, calibration)
    return {
        "state": state_digest(model),
        "alone": state_digest(alone),
        "unrecovered": unrecovered,
        "batches": batches,
        "own_shards": own_shards,
        "logits": logits,
        "teacher_unchanged": shards_digest(teacher) == teacher_before,
        "sharded": all(isinstance(parameter, DTensor) for parameter in model.parameters()),
    }


def sharded_recover_one_block_at_a_time() -> dict[str, object]:
    """Which blocks of the model and of its teacher are whole (gathered) each time the method recovers a block."""
    model, teacher = fully_sharded(shrunk_or_pruned("refit")[0]), fully_sharded(fresh_model("refit"))

    def whole(of: nn.Module) -> list[int]:
        return [
            index
            for index, block in enumerate(of.model.layers)
            if not any(isinstance(parameter, DTensor) for parameter in block.parameters())
        ]

    seen: list[tuple[list[int], list[int]]] = []

    class Watched(prunereg.get("refit")):
        def recover_block(self, block: RecoveryBlock) -> str | None:
            seen.append((whole(model), whole(teacher)))
            return super().recover_block(block)

    prunereg.recover(model, teacher, calibration_ids(7, 16), Watched(bias=False), batch_size=1)
    return {"whole_at_recoveries": seen, "whole_after": (whole(model), whole(teacher))}


def sharded_recover_refused() -> dict[str, object]:
    """Each recovery prunereg refuses on a sharded model: its error, one line, and whether the shards are unchanged."""
    calibration = calibration_ids(7, 16)

    def without_a_block() -> nn.Module:
        model, _ = shrunk_or_pruned("replace")
        return fully_sharded(model)

    runs: dict[str, Refusal] = {
        "new_biases": (
            lambda: fully_sharded(tiny_llama(layers=3)),
            lambda model: prunereg.recover(model, tiny_llama(layers=3), calibration, "refit"),
        ),
        "not_data_parallel": (
            lambda: fully_sharded(tiny_llama(layers=3)),
            lambda model: prunereg.recover(
                model, tiny_llama(layers=3), calibration, "refit", bias=False, data_parallel=False
            ),
        ),
        "teacher_not_data_parallel": (
            lambda: tiny_llama(layers=3),
            lambda model: prunereg.recover(
                model, fully_sharded(tiny_llama(layers=3)), calibration, "refit", bias=False, data_parallel=False
            ),
        ),
        "removed_blocks_unnamed": (
            without_a_block,
            lambda model: prunereg.recover(model, tiny_llama(layers=3), calibration, "replace", bias=False),
        ),
    }
    return refusals(runs)


CASES: dict[str, Callable[[], object]] = {
    **{f"fsdp_{name}": (lambda name=name: run_fsdp_oneshot(name)) for name in FSDP_RUNS},
    "fsdp_gathered_one_block_at_a_time": fsdp_gathered_one_block_at_a_time,
    "fsdp_refused": fsdp_refused,
    "fsdp_masks": fsdp_masks,
    "fsdp_one_rank_raises": fsdp_one_rank_raises,
    "fsdp_rank_raises_after_writing_a_block": fsdp_rank_raises_after_writing_a_block,
    **{f"sharded_recover_{name}": (lambda name=name: run_sharded_recover(name)) for name in SHARDED_RECOVER_RUNS},
    "sharded_recover_refused": sharded_recover_refused,
    "sharded_recover_one_block_at_a_time": sharded_recover_one_block_at_a_time,
    **{f"oneshot_{name}": (lambda name=name: run_oneshot(name)) for name in ONESHOT_RUNS},
    **{f"shrink_{name}": (lambda name=name: run_shrink(name)) for name in SHRINK_RUNS},
    "oneshot_refused_when_ranks_disagree": refused_when_ranks_disagree,
    "oneshot_solved_by_one_rank": solved_by_one_rank,
    **{f"recover_{name}": (lambda name=name: run_recover(name)) for name in RECOVER_RUNS},
    "recover_blockwise_refused": lambda: error_and_unchanged(
        lambda model: prunereg.recover(model, tiny_llama(layers=3), calibration_ids(7, 16), "blockwise")
    ),
    "recover_shrink_blockwise_refused": lambda: error_and_unchanged(
        lambda model: prunereg.shrink(model, "flap", calibration_ids(7, 16), mlp=0.5, recover="blockwise")
    ),
    "recover_method_reads_its_own_share": lambda: error_and_unchanged(
        lambda model: prunereg.recover(
            model, tiny_llama(layers=3), calibration_ids(7, 16), ReadsItsOwnShare(), batch_size=1
        )
    ),
    "recover_fewer_batches_than_ranks": lambda: error_and_unchanged(
        lambda model: prunereg.recover(model, tiny_llama(layers=3), calibration_ids(2, 16), "refit", batch_size=2)
    ),
    "folder_oneshot": oneshot_folder_written_by_rank_zero,
    "dies_folder_oneshot": oneshot_folder_when_a_rank_dies,
    "folder_command": lambda: run_oneshot_command(Path(sys.argv[1]).parent / "memory"),
    "folder_command_streamed": lambda: run_oneshot_command(Path(sys.argv[1]).parent / "streamed", "--stream"),
    "oneshot_one_rank_raises": one_rank_raises,
    "oneshot_combine_raises": lambda: error_and_unchanged(combine_raises_on_rank_one),
    **{
        f"streamed_shrink_{name}": (lambda name=name: run_shrink_folder(Path(sys.argv[1]).parent / name, name))
        for name in STREAMED_SHRINK_RUNS
    },
    "streamed_shrink_command": lambda: run_command(
        Path(sys.argv[1]).parent / "command", shrink_arguments(Path(sys.argv[1]).parent / "command", "--stream")
    ),
    "streamed_shrink_command_in_memory": lambda: run_command(
        Path(sys.argv[1]).parent / "in_memory", shrink_arguments(Path(sys.argv[1]).parent / "in_memory")
    ),
    "streamed_shrink_raises": lambda: shrink_folder_when_a_rank_raises(Path(sys.argv[1]).parent / "raises"),
}


def launch(world_size: int, folder: Path, prefix: str, *, a_rank_dies: bool = False) -> list[Any]:
    """Run the cases whose names start with ``prefix`` on ``world_size`` gloo ranks (one thread each).

    Each rank's results, in rank order; with ``a_rank_dies``, the launch may
    fail and a rank without results has None.
    """
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "results"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cases = [name for name in CASES if name.startswith(prefix)]
    # A session of its own: a launch that times out takes its forked ranks with it.
    ranks = subprocess.Popen(
        [sys.executable, __file__, str(out), str(world_size), *cases],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = ranks.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(ranks.pid, signal.SIGKILL)
        output, _ = ranks.communicate()
        raise AssertionError(f"the {world_size} ranks did not finish in 300 s:\n{output}") from None
    assert a_rank_dies or ranks.returncode == 0, output
    files = [Path(f"{out}.{rank}") for rank in range(world_size)]
    return [json.loads(path.read_text()) if path.exists() else None for path in files]


#: The numbers of ranks every run is compared at.
WORLD_SIZES = (1, 2, 3)


def rank_test_marks() -> list[Any]:
    """A rank-test module's ``pytestmark``: gloo needed, and slow, as the project marks tests that start processes."""
    import pytest
    import torch.distributed as dist

    return [pytest.mark.skipif(not dist.is_gloo_available(), reason="needs the gloo backend"), pytest.mark.slow]


if TYPE_CHECKING:  # the ranks run this file as a script, without pytest
    from tests.support.processes import Worlds


def worlds_fixture(prefix: str) -> Any:
    """A module fixture: the cases starting with ``prefix``, launched once at each world size a test asks for."""
    import pytest

    from tests.support.processes import Worlds

    @pytest.fixture(scope="module")
    def worlds(tmp_path_factory: pytest.TempPathFactory) -> Worlds[list[dict[str, dict[str, Any]]]]:
        return Worlds(lambda size: launch(size, tmp_path_factory.mktemp(f"world{size}"), prefix))

    return worlds


def same_as_alone(
    worlds: Worlds[list[dict[str, dict[str, Any]]]], size: int, case: str, counted: str = "batches"
) -> tuple[int, list[int]]:
    """Check every rank of ``size`` ends ``case`` (``oneshot_wanda``) with the one process's model, bit for bit.

    What the one process ``counted`` (the batches it ran through the model, or
    the groups it ``solves``), and what each rank did, in rank order.
    """
    kind, name = case.split("_", 1)  # an ``fsdp_`` case is compared with the one-shot run on the unsharded model
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank runs: torch's kernels may round otherwise at other thread counts
    try:
        alone = {"oneshot": run_oneshot, "fsdp": run_oneshot, "shrink": run_shrink, "recover": run_recover}[kind](name)
    finally:
        torch.set_num_threads(threads)
    per_rank = values(worlds[size], case)
    assert [found["state"] for found in per_rank] == [alone["state"]] * size
    return alone[counted], [found[counted] for found in per_rank]


def same_as_alone_from_shares(worlds: Worlds[list[dict[str, dict[str, Any]]]], size: int, case: str) -> None:
    """:func:`same_as_alone`, and each rank ran only its share of the batches (the embedding sees each once)."""
    alone, batches = same_as_alone(worlds, size, case)
    assert sum(batches) == alone and (size == 1 or max(batches) < alone)


def values(per_rank: list[dict[str, dict[str, Any]]], case: str) -> list[Any]:
    """What ``case`` returned on each rank, in rank order (a rank where it raised fails the test with its traceback)."""
    found = []
    for rank in per_rank:
        assert rank[case]["ok"], rank[case].get("error")
        found.append(rank[case]["value"])
    return found


if __name__ == "__main__":
    from tests.support import distributed_worker as worker

    worker.CASES.clear()
    worker.CASES.update(CASES)
    worker.main()
