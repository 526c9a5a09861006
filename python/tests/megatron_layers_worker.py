"""One rank of test_megatron_layers.py: megatron-core's own tensor-parallel code (its
mappings, ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, a TransformerLayer
and a small GPTModel built with a pg_collection) run forward and backward on CPU Gloo ranks,
first on the groups of megatron-core's own parallel_state, then on commgrid.torch's, and at
tensor-parallel size 1 as the single-rank reference.

Usage: megatron_layers_worker.py RANK WORLD PORT (rank 0 hosts torch's TCPStore on PORT).
Prints one JSON line: what was compared, per layout."""

import contextlib
import dataclasses
import inspect
import json
import sys
import types
import warnings
from datetime import timedelta

warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import megatron.core.parallel_state as mps  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa: E402
from megatron.core.models.gpt.gpt_model import GPTModel  # noqa: E402
from megatron.core.process_groups_config import ProcessGroupCollection  # noqa: E402
from megatron.core.tensor_parallel import mappings  # noqa: E402
from megatron.core.tensor_parallel.layers import (ColumnParallelLinear,  # noqa: E402
                                                  RowParallelLinear, VocabParallelEmbedding)
from megatron.core.transformer.identity_op import IdentityFuncOp, IdentityOp  # noqa: E402
from megatron.core.transformer.spec_utils import build_module  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

import commgrid  # noqa: E402
import commgrid.torch.head as cps  # noqa: E402

TIMEOUT = timedelta(seconds=300)  # bounds the rendezvous and every collective
SEQ, BATCH, HIDDEN, FFN, OUT, VOCAB, HEADS = 4, 2, 8, 16, 12, 32, 4


def expect(cond, what):
    if not cond:
        raise AssertionError(f"rank {dist.get_rank()}: {what}")


# --- commgrid.torch.head as megatron.core.parallel_state, in this process -------------------

@contextlib.contextmanager
def commgrid_as_parallel_state():
    """While inside, every megatron module sees commgrid.torch.head where it saw megatron's
    parallel_state: the module (``from megatron.core import parallel_state``), the functions
    imported from it (``from megatron.core.parallel_state import get_...``) and
    sys.modules["megatron.core.parallel_state"] (imports made later). What launching with
    sys.modules["megatron.core.parallel_state"] = commgrid.torch.head before megatron's first
    import does, but undone on exit, so the same process also runs megatron's own state."""
    swapped = []
    missing = set()
    for name, module in list(sys.modules.items()):
        if module is None or module is mps or not name.startswith("megatron"):
            continue
        for attr, value in list(vars(module).items()):
            if value is mps:
                new = cps
            elif inspect.isfunction(value) and value.__module__ == mps.__name__:
                new = getattr(cps, value.__name__, None)
                if new is None:
                    missing.add(value.__name__)
                    continue
            else:
                continue
            swapped.append((module, attr, value))
            setattr(module, attr, new)
    expect(not missing, f"commgrid.torch.head lacks {sorted(missing)}")
    sys.modules[mps.__name__] = cps
    try:
        yield len(swapped)
    finally:
        sys.modules[mps.__name__] = mps
        for module, attr, value in reversed(swapped):
            setattr(module, attr, value)


# --- the code under test ------------------------------------------------------------------

def config(tp):
    return TransformerConfig(num_layers=2, hidden_size=HIDDEN, ffn_hidden_size=FFN,
                             num_attention_heads=HEADS, tensor_model_parallel_size=tp,
                             use_cpu_initialization=True, gradient_accumulation_fusion=False,
                             hidden_dropout=0.0, attention_dropout=0.0, bias_activation_fusion=False,
                             bias_dropout_fusion=False, masked_softmax_fusion=False,
                             persist_layer_norm=False, apply_rope_fusion=False)


def init_method(weight):
    return torch.nn.init.normal_(weight, std=0.5)


def data(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def mlp_only_layer_spec():
    """Megatron's local (no Transformer Engine) GPT layer spec without self-attention: its
    DotProductAttention takes its buffer from parallel_state.get_global_memory_buffer(), which
    megatron-core allocates on torch.cuda.current_device()."""
    spec = get_gpt_layer_local_spec()
    spec.submodules = dataclasses.replace(spec.submodules, input_layernorm=IdentityOp,
                                          self_attention=IdentityOp, self_attn_bda=IdentityFuncOp)
    return spec


def grads(module):
    return {f"{n}.grad": p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


def run_blocks(tp_group, pgc, tp, dp_rank, implicit=None):
    """Megatron's blocks on ``tp_group`` (and ``pgc``); returns name -> tensor. ``implicit``:
    the group a layer built without tp_group must find through parallel_state (None: the
    reference at tp 1, which passes its group explicitly everywhere)."""
    tp_rank, out = tp_group.rank(), {}
    expect(tp_group.size() == tp, f"tp group of size {tp_group.size()}, not {tp}")
    seed = 1000 * dp_rank  # one batch per dp rank; the tp ranks of a group see the same one

    # Mappings. Forward and backward of copy_to and reduce_from; scatter_to's forward and
    # gather_from's backward (the split): the other directions all-gather into a tensor made
    # on torch.cuda.current_device().
    x = data(seed + 1, SEQ, BATCH, OUT).requires_grad_()
    w = data(seed + 100 + tp_rank, SEQ, BATCH, OUT)  # a different loss weight on each tp rank
    y = mappings.copy_to_tensor_model_parallel_region(x, group=tp_group)
    (y * w).sum().backward()
    out.update({"copy_to": y.detach().clone(), "copy_to.grad": x.grad.clone()})
    x = (data(seed + 200 + tp_rank, SEQ, BATCH, OUT)).requires_grad_()
    y = mappings.reduce_from_tensor_model_parallel_region(x, group=tp_group)
    (y * data(seed + 4, SEQ, BATCH, OUT)).sum().backward()
    out.update({"reduce_from": y.detach().clone(), "reduce_from.grad": x.grad.clone()})
    full = data(seed + 5, SEQ, BATCH, OUT)
    out["scatter_to"] = mappings.scatter_to_tensor_model_parallel_region(full, group=tp_group)
    split, _ = mappings._GatherFromModelParallelRegion.backward(types.SimpleNamespace(group=tp_group),
                                                                full)
    out["gather_from.backward"] = split

    cfg = config(tp)
    # ColumnParallelLinear: output kept sharded (gather_output=True all-gathers on CUDA).
    torch.manual_seed(11)
    col = ColumnParallelLinear(HIDDEN, OUT, config=cfg, init_method=init_method, bias=True,
                               gather_output=False, tp_group=tp_group)
    expect(tuple(col.weight.shape) == (OUT // tp, HIDDEN), f"column weight {tuple(col.weight.shape)}")
    expect(col.tp_group is tp_group, "ColumnParallelLinear did not keep the group passed")
    x = data(seed + 6, SEQ, BATCH, HIDDEN).requires_grad_()
    y, _ = col(x)
    dy = data(seed + 7, SEQ, BATCH, OUT).chunk(tp, dim=-1)[tp_rank]
    (y * dy).sum().backward()
    out.update({"column": y.detach().clone(), "column.weight": col.weight.detach().clone(),
                "column.input.grad": x.grad.clone()})
    out.update({f"column.{k}": v for k, v in grads(col).items()})

    # RowParallelLinear on an input already split (input_is_parallel=False scatters, whose
    # backward all-gathers on CUDA).
    torch.manual_seed(12)
    row = RowParallelLinear(OUT, HIDDEN, config=cfg, init_method=init_method, bias=True,
                            input_is_parallel=True, skip_bias_add=False, tp_group=tp_group)
    expect(tuple(row.weight.shape) == (HIDDEN, OUT // tp), f"row weight {tuple(row.weight.shape)}")
    x = data(seed + 8, SEQ, BATCH, OUT).chunk(tp, dim=-1)[tp_rank].clone().requires_grad_()
    y, _ = row(x)
    (y * data(seed + 9, SEQ, BATCH, HIDDEN)).sum().backward()
    out.update({"row": y.detach().clone(), "row.weight": row.weight.detach().clone(),
                "row.input.grad": x.grad.clone()})
    out.update({f"row.{k}": v for k, v in grads(row).items()})

    # VocabParallelEmbedding: each rank holds VOCAB / tp rows.
    torch.manual_seed(13)
    emb = VocabParallelEmbedding(VOCAB, HIDDEN, init_method=init_method, config=cfg,
                                 tp_group=tp_group)
    expect(tuple(emb.weight.shape) == (VOCAB // tp, HIDDEN), f"embedding {tuple(emb.weight.shape)}")
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed + 10))
    y = emb(ids)
    (y * data(seed + 11, BATCH, SEQ, HIDDEN)).sum().backward()
    out.update({"embedding": y.detach().clone(), "embedding.weight": emb.weight.detach().clone()})
    out.update({f"embedding.{k}": v for k, v in grads(emb).items()})

    # The same layers built without a group find it through parallel_state.
    if implicit is not None:
        torch.manual_seed(11)
        col2 = ColumnParallelLinear(HIDDEN, OUT, config=cfg, init_method=init_method, bias=True,
                                    gather_output=False)
        expect(col2.tp_group is implicit, "ColumnParallelLinear without tp_group: not the state's group")
        expect(torch.equal(col2.weight, col.weight), "implicit group: another weight shard")
        emb2 = VocabParallelEmbedding(VOCAB, HIDDEN, init_method=init_method, config=cfg)
        expect(emb2.tp_group is implicit, "VocabParallelEmbedding without tp_group: not the state's")

    # A TransformerLayer (layer norm, MLP of ColumnParallelLinear + GeLU + RowParallelLinear,
    # bias-dropout-add) built with the pg_collection.
    torch.manual_seed(14)
    layer = build_module(mlp_only_layer_spec(), config=cfg, layer_number=1, pg_collection=pgc)
    expect(tuple(layer.mlp.linear_fc1.weight.shape) == (FFN // tp, HIDDEN), "layer fc1 shard")
    expect(layer.mlp.linear_fc1.tp_group is tp_group, "layer fc1 not on the collection's tp group")
    x = data(seed + 12, SEQ, BATCH, HIDDEN).requires_grad_()
    y, _ = layer(x, attention_mask=None)
    (y * data(seed + 13, SEQ, BATCH, HIDDEN)).sum().backward()
    out.update({"layer": y.detach().clone(), "layer.input.grad": x.grad.clone()})
    out.update({f"layer.{k}": v for k, v in grads(layer).items()})

    # A GPTModel of two such layers: embedding, decoder, output layer and Megatron's
    # vocab-parallel cross entropy.
    torch.manual_seed(15)
    gpt = GPTModel(config=cfg, transformer_layer_spec=mlp_only_layer_spec(), vocab_size=VOCAB,
                   max_sequence_length=SEQ, pg_collection=pgc)
    expect(tuple(gpt.output_layer.weight.shape) == (VOCAB // tp, HIDDEN), "output layer shard")
    gen = torch.Generator().manual_seed(seed + 14)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    pos = torch.arange(SEQ).unsqueeze(0).expand(BATCH, SEQ)
    loss = gpt(ids, pos, None, labels=labels)
    loss.sum().backward()
    out["gpt.loss"] = loss.detach().clone()
    out.update({f"gpt.{k}": v for k, v in grads(gpt).items()})
    return out


def cuda_only_calls(tp_group, tp):
    """The calls of the same blocks that need CUDA: each allocates a tensor on
    torch.cuda.current_device() (or "cuda"), so on a machine without CUDA every rank raises
    there alike and none is left in a collective. Returns their names; raises if one ran."""
    cfg = config(tp)
    x = data(0, SEQ, BATCH, OUT)

    def scatter_backward():
        y = mappings.scatter_to_tensor_model_parallel_region(x.clone().requires_grad_(), group=tp_group)
        y.sum().backward()

    def column_gathered():
        col = ColumnParallelLinear(OUT, OUT, config=cfg, init_method=init_method, bias=True,
                                   gather_output=True, tp_group=tp_group)
        col(x)

    def row_split_backward():
        row = RowParallelLinear(OUT, OUT, config=cfg, init_method=init_method, bias=True,
                                input_is_parallel=False, skip_bias_add=False, tp_group=tp_group)
        row(x.clone().requires_grad_())[0].sum().backward()

    def attention():
        pgc = ProcessGroupCollection.use_mpu_process_groups()
        layer = build_module(get_gpt_layer_local_spec(), config=cfg, layer_number=1, pg_collection=pgc)
        layer(data(0, SEQ, BATCH, HIDDEN), attention_mask=None)

    calls = {
        "mappings.gather_from_tensor_model_parallel_region (forward)":
            lambda: mappings.gather_from_tensor_model_parallel_region(x, group=tp_group),
        "mappings.scatter_to_tensor_model_parallel_region (backward)": scatter_backward,
        "mappings.gather_from_sequence_parallel_region (forward)":
            lambda: mappings.gather_from_sequence_parallel_region(x, group=tp_group),
        "mappings.reduce_scatter_to_sequence_parallel_region (forward)":
            lambda: mappings.reduce_scatter_to_sequence_parallel_region(x, group=tp_group),
        "ColumnParallelLinear(gather_output=True) (forward)": column_gathered,
        "RowParallelLinear(input_is_parallel=False) (backward)": row_split_backward,
        "TransformerLayer of get_gpt_layer_local_spec() (DotProductAttention, forward)": attention,
    }
    for name, call in calls.items():
        try:
            call()
        except (RuntimeError, AssertionError) as e:  # torch's CUDA-less builds assert instead
            expect("cuda" in str(e).lower() or "nvidia" in str(e).lower(), f"{name}: {e}")
        else:
            raise AssertionError(f"rank {dist.get_rank()}: {name} ran without CUDA")
    return sorted(calls)


# --- the three runs -----------------------------------------------------------------------

def on_megatron(tp, report):
    mps.initialize_model_parallel(tensor_model_parallel_size=tp, create_gloo_process_groups=False)
    try:
        g = mps.get_tensor_model_parallel_group()
        out = run_blocks(g, ProcessGroupCollection.use_mpu_process_groups(), tp,
                         mps.get_data_parallel_rank(), implicit=g)
        if tp == 2 and not torch.cuda.is_available():
            report["cuda_only"] = cuda_only_calls(g, tp)
        return out
    finally:
        mps.destroy_model_parallel()


def on_commgrid(tp):
    expect(not mps.is_initialized(), "megatron's parallel_state still initialized")
    with commgrid_as_parallel_state() as swapped:
        expect(swapped > 10, f"only {swapped} references to parallel_state replaced")
        cps.initialize_model_parallel(tensor_model_parallel_size=tp, create_gloo_process_groups=False)
        try:
            g = cps.get_tensor_model_parallel_group()
            expect(mps._TENSOR_MODEL_PARALLEL_GROUP is None, "megatron's state has a tp group")
            expect(dist.get_process_group_ranks(g) == commgrid.Layout(
                dist.get_world_size(), tp=tp).group_of("tp", dist.get_rank()), "tp ranks")
            pgc = commgrid.ProcessGroupCollection.use_mpu_process_groups()
            expect(pgc.tp is g, "collection's tp group")
            return run_blocks(g, pgc, tp, cps.get_data_parallel_rank(), implicit=g)
        finally:
            cps.destroy_model_parallel()


def on_one_rank(alone, dp_rank):
    """TP 1: the same code with this rank alone in every group of the collection."""
    pgc = ProcessGroupCollection(tp=alone, pp=alone, cp=alone, tp_cp=alone, embd=None,
                                 pos_embd=None, dp=alone, dp_cp=alone)
    return run_blocks(alone, pgc, 1, dp_rank)


def mapping_reference(tp, tp_rank, dp_rank):
    """What the mappings give, from every tp rank's data made here."""
    seed = 1000 * dp_rank
    x = data(seed + 1, SEQ, BATCH, OUT)
    return {"copy_to": x, "copy_to.grad": sum(data(seed + 100 + r, SEQ, BATCH, OUT) for r in range(tp)),
            "reduce_from": sum(data(seed + 200 + r, SEQ, BATCH, OUT) for r in range(tp)),
            "reduce_from.grad": data(seed + 4, SEQ, BATCH, OUT),
            "scatter_to": data(seed + 5, SEQ, BATCH, OUT),
            "gather_from.backward": data(seed + 5, SEQ, BATCH, OUT)}


SHARDED_LAST = {"scatter_to", "gather_from.backward", "column", "column.bias.grad", "row.input.grad"}
SHARDED_FIRST = {"column.weight", "column.weight.grad", "embedding.weight",
                 "embedding.weight.grad", "gpt.output_layer.weight.grad"}
SHARDED_COLUMNS = {"row.weight", "row.weight.grad"}


def shard(name, full, tp, tp_rank):
    """The part of the tp-1 result that a rank of a tp group holds."""
    if name in SHARDED_LAST or name.endswith("linear_fc1.bias.grad"):
        return full.chunk(tp, dim=-1)[tp_rank]
    if name in SHARDED_FIRST or name.endswith(("linear_fc1.weight.grad", "word_embeddings.weight.grad")):
        return full.chunk(tp, dim=0)[tp_rank]
    if name in SHARDED_COLUMNS or name.endswith("linear_fc2.weight.grad"):
        return full.chunk(tp, dim=1)[tp_rank]
    return full


def difference(got, want):
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{got.dtype}{tuple(got.shape)} vs {want.dtype}{tuple(want.shape)}"
    return f"max |diff| {(got.double() - want.double()).abs().max().item()}"


def main():
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=TIMEOUT)
    # Each rank alone, for the reference at tp 1; made by every rank, so every rank's count of
    # groups stays the same.
    alone = [dist.new_group([r]) for r in range(world)][rank]
    report = {"rank": rank}
    for tp in (2, world):
        theirs = on_megatron(tp, report)
        ours = on_commgrid(tp)
        expect(sorted(theirs) == sorted(ours), f"tp {tp}: other results {sorted(set(theirs) ^ set(ours))}")
        for name, want in theirs.items():  # bitwise: the same ranks run the same operations
            got = ours[name]
            expect(got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want),
                   f"tp {tp}: {name} differs on commgrid's groups: {difference(got, want)}")
        # The single-rank reference: the same code at tp 1 on the batch of this rank's dp rank,
        # equal up to float32 rounding (tp ranks sum partial products that one rank sums in
        # another order; all-reduce adds in Gloo's order).
        tp_rank, dp_rank = rank % tp, rank // tp
        ref = on_one_rank(alone, dp_rank)
        ref.update(mapping_reference(tp, tp_rank, dp_rank))
        expect(all(v.any() for v in ref.values()), f"all-zero results: "
               f"{[k for k, v in ref.items() if not v.any()]}")  # nothing compared is trivial
        for name, got in theirs.items():
            want = shard(name, ref[name], tp, tp_rank)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5,
                                       msg=lambda m, n=name: f"rank {rank} tp {tp} {n}: {m}")
        report[f"tp{tp}"] = len(theirs)
        dist.barrier()
    print(json.dumps(report), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
