"""Exercises checked without ranks: the 1F1B list (played in the schedule simulator), the groups of
a mesh layout (against ``ParallelDims``) and KV-cache capacity (against ``theory.serving.serving`` and a
real cache block). Each checker passes its solution and names realistic wrong answers."""

from playbook import exercises
from playbook.exercises import NotYetWritten


# ---- 4. pipelines (through the simulator) -----------------------------------------------------
def pp_warmup_off_by_one(rank, p, m):
    warm = min(p - rank, m)  # p − r, one too many
    order = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", i) for i in range(m - warm, m)]


def pp_backward_reversed(rank, p, m):
    warm = min(p - rank - 1, m)
    order = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", i) for i in reversed(range(m - warm, m))]  # last in, first out


def pp_no_cooldown(rank, p, m):
    warm = min(p - rank - 1, m)
    order = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        order += [("F", warm + i), ("B", i)]
    return order


def pp_blank(rank, p, m):
    raise NotYetWritten("one_f_one_b")


def test_pp_solution_passes_with_simulated_bubble():
    v = exercises.pp.check(exercises.pp.solution)
    assert v.ok, v
    for p, m in exercises.pp.CASES:
        assert abs(v.numbers[f"p={p} m={m} bubble (idle/total), simulated"] - (p - 1) / (m + p - 1)) < 1e-12
        assert v.numbers[f"p={p} m={m} peak micro-batches held per rank"] == [min(p - r, m) for r in range(p)]


def test_pp_wrong_answers_are_named():
    v = exercises.pp.check(pp_warmup_off_by_one)
    assert not v.ok and "rank 0 runs 5 forward(s) before its first backward" in v.message, v
    assert "1F1B runs min(p−r, m) = 4 there" in v.message and "warm-up off by one, too many" in v.message, v
    v = exercises.pp.check(pp_backward_reversed)
    assert not v.ok and "backwards go in the order of the forwards" in v.message, v
    assert "rank 0 runs the backward of micro-batch 5 before micro-batch 4" in v.message, v
    v = exercises.pp.check(pp_no_cooldown)
    assert not v.ok and "rank 0 never runs the backward of micro-batch(es) [3, 4, 5]" in v.message, v
    assert "the cool-down is missing" in v.message, v
    v = exercises.pp.check(pp_blank)
    assert not v.ok and v.message.startswith("not yet written"), v


def pp_warmup_too_short(rank, p, m):
    return exercises.pp.solution(rank + 1, p, m) if rank < p - 1 else exercises.pp.solution(rank, p, m)


def test_pp_a_warmup_too_short_is_named():
    v = exercises.pp.check(pp_warmup_too_short)  # rank r uses rank r+1's list: one forward too few
    assert not v.ok and "rank 0 runs 3 forward(s) before its first backward" in v.message, v
    assert "warm-up off by one, too few" in v.message, v


def pp_flushes_after_the_first_backward_on_rank_1(rank, p, m):
    """Rank 1 only: its warm-up and first forward-backward are 1F1B's, then every forward left, then
    every backward (GPipe's order after the warm-up). Every earlier rule holds: the forwards before
    the first backward, every backward present, in order."""
    if rank != 1:
        return exercises.pp.solution(rank, p, m)
    warm = min(p - rank - 1, m)
    return (
        [("F", i) for i in range(warm + 1)]
        + [("B", 0)]
        + [("F", i) for i in range(warm + 1, m)]
        + [("B", i) for i in range(1, m)]
    )


def test_pp_an_order_wrong_on_a_later_rank_only_is_named():
    """Issue 48, near-miss 11: the order is compared on every rank, not on rank 0 alone. p = 4,
    m = 6: rank 1 warms up with p − r − 1 = 2 forwards, runs F2 B0, and then 1F1B's F3 where this
    list has F3 too, but B1 next where it has F4 (position 5)."""
    v = exercises.pp.check(pp_flushes_after_the_first_backward_on_rank_1)
    assert not v.ok and v.message.startswith("p=4, m=6: "), v
    assert "rank 1, position 5: yours is F4, 1F1B's is B1" in v.message, v


# ---- 7. hybrid mesh ---------------------------------------------------------------------------
def mesh_dp_fastest(dims, axis):
    order = ["dp", "cp", "tp", "pp"]  # dp fastest: the wrong order
    sizes = {a: getattr(dims, a) for a in order}
    stride = 1
    for a in order[: order.index(axis)]:
        stride *= sizes[a]
    return [[r + i * stride for i in range(sizes[axis])] for r in range(dims.world) if (r // stride) % sizes[axis] == 0]


def mesh_consecutive(dims, axis):
    k = getattr(dims, axis)
    return [list(range(s, s + k)) for s in range(0, dims.world, k)]  # stride 1 for every axis


def mesh_forgets_last(dims, axis):
    return exercises.mesh.solution(dims, axis)[:-1] if getattr(dims, axis) > 1 else exercises.mesh.solution(dims, axis)


def test_mesh_solution_passes():
    v = exercises.mesh.check(exercises.mesh.solution)
    assert v.ok, v


def test_mesh_wrong_answers_are_named():
    v = exercises.mesh.check(mesh_dp_fastest)
    assert not v.ok and "your tp groups are this layout's dp groups" in v.message, v
    assert "ranks go tp fastest" in v.message, v
    v = exercises.mesh.check(mesh_consecutive)
    assert not v.ok and "dp2×tp2×pp2 (8 ranks), axis dp: your dp groups are this layout's tp groups" in v.message, v
    assert "the ranks of one dp group are tp·cp apart: [[0, 2], [1, 3], [4, 6], [5, 7]]" in v.message, v
    v = exercises.mesh.check(mesh_forgets_last)
    assert not v.ok and "every rank must be in exactly one tp group; yours leave out [6, 7]" in v.message, v


# ---- 8. serving -------------------------------------------------------------------------------
def _act(cfg, context, tp):  # the activation peak the exercise gives: one prompt's forward
    return exercises.serving.serving.activation_peak(cfg, tokens=context, tp=tp)


def serve_no_factor_two(cfg, hw, context, tp):
    per_token = cfg.n_layers * (cfg.kv_heads // tp) * cfg.dim_head * 2  # the keys only
    budget = 0.9 * hw.capacity_bytes - 2 * cfg.num_params() / tp - _act(cfg, context, tp)
    return per_token, int(budget // (16 * per_token)) // -(-context // 16)


def serve_query_heads(cfg, hw, context, tp):
    per_token = 2 * cfg.n_layers * (cfg.n_heads // tp) * cfg.dim_head * 2  # MHA's heads, not GQA's
    budget = 0.9 * hw.capacity_bytes - 2 * cfg.num_params() / tp - _act(cfg, context, tp)
    return per_token, int(budget // (16 * per_token)) // -(-context // 16)


def _serve_budget(budget_of):
    def answer(cfg, hw, context, tp):
        per_token = 2 * cfg.n_layers * (cfg.kv_heads // tp) * cfg.dim_head * 2
        budget = budget_of(cfg, hw, context, tp)
        return per_token, int(budget // (16 * per_token)) // -(-context // 16)

    return answer


serve_all_memory = _serve_budget(lambda c, hw, n, tp: hw.capacity_bytes - 2 * c.num_params() / tp - _act(c, n, tp))
serve_weights_forgotten = _serve_budget(lambda c, hw, n, tp: 0.9 * hw.capacity_bytes - _act(c, n, tp))
serve_no_activations = _serve_budget(lambda c, hw, n, tp: 0.9 * hw.capacity_bytes - 2 * c.num_params() / tp)
serve_datasheet = _serve_budget(lambda c, hw, n, tp: 0.9 * hw.memory_bytes - 2 * c.num_params() / tp - _act(c, n, tp))


def test_serving_solution_passes_with_a_measured_block():
    v = exercises.serving.check(exercises.serving.solution)
    assert v.ok, v
    case = "llama-3.1-8b on h100-sxm, context 8192, tp=1"
    assert v.numbers[f"{case}: KV bytes/token, measured on a real bf16 block"] == 2 * 32 * 8 * 128 * 2
    case = "llama-3.1-70b on h100-sxm, context 32768, tp=4"  # 80 layers, 8 KV heads split over 4 GPUs
    assert v.numbers[f"{case}: KV bytes/token, measured on a real bf16 block"] == 2 * 80 * 2 * 128 * 2


def test_serving_measures_one_kv_head_per_gpu_when_tp_exceeds_the_kv_heads():
    """Issue 48, near-miss 13: Llama 3.1 70B has 8 KV heads; at tp = 16 each GPU keeps a copy of one
    (vLLM replicates a KV head when tp > kv_heads), never 0: 2 · 80 layers · 1 · 128 · 2 bytes."""
    v = exercises.serving.check(exercises.serving.solution)
    case = "llama-3.1-70b on h100-sxm, context 8192, tp=16"
    assert v.numbers[f"{case}: KV bytes/token, measured on a real bf16 block"] == 2 * 80 * 1 * 128 * 2 == 40_960
    assert v.numbers[f"{case}: KV bytes/token, yours = predicted"] == 40_960


def test_serving_wrong_answers_are_named():
    v = exercises.serving.check(serve_no_factor_two)
    assert not v.ok and "is half the right value" in v.message and "a key AND a value" in v.message, v
    assert "a real cache block measures 131,072" in v.message, v
    v = exercises.serving.check(serve_query_heads)
    assert not v.ok and "4× too large" in v.message and "8 KV heads, not its 32 query heads" in v.message, v
    # llama-3.1-8b, one H100: 0.9 of 81,559 MiB, less 2·8,030,261,248 B of weights, less one 8,192-token
    # forward's peak (8,192 rows × (2·4,096 residual + 3·14,336 MLP + 4,096 out) × 2 B), in 2 MiB blocks
    block, seq = 16 * 131_072, 512
    weights, act = 2 * 8_030_261_248, 8192 * (2 * 4096 + 3 * 14_336 + 4096) * 2
    right = int((0.9 * 81_559 * 2**20 - weights - act) // block) // seq
    everything = int((81_559 * 2**20 - weights - act) // block) // seq
    v = exercises.serving.check(serve_all_memory)
    assert not v.ok and f"your max_seqs is {everything}, predicted {right}" in v.message, v
    assert "keeps 10% back" in v.message, v
    v = exercises.serving.check(serve_weights_forgotten)
    assert not v.ok and "subtract them before filling it with cache" in v.message, v
    v = exercises.serving.check(serve_no_activations)
    assert not v.ok and "activations of vLLM's profiling run" in v.message, v
    v = exercises.serving.check(serve_datasheet)
    assert not v.ok and "hw.capacity_bytes" in v.message, v


# ---- the notebooks' exercise sections ----------------------------------------------------------
def _chapter_script(chapter):
    import importlib.util
    import sys
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "notebooks" / "_exercise_cells"
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location(f"exercise_cells_{chapter}", folder / f"{chapter}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module, sys.modules["_insert"]
    finally:
        sys.path.remove(str(folder))


def test_chapters_carry_their_exercise_with_the_checked_solution():
    """Every chapter 1-8 holds the cells its script makes (so the folded solution is the one the
    tests check), once, with no outputs committed."""
    import nbformat

    for chapter in ("01", "02", "03", "04", "05", "06", "07", "08"):
        script, _ = _chapter_script(chapter)
        (path,) = __import__("glob").glob(f"notebooks/{chapter}_*.ipynb")
        cells = nbformat.read(path, as_version=4).cells
        at = next(i for i, c in enumerate(cells) if c.source.startswith("## Exercise"))
        kinds = {"markdown": "md", "code": "code"}
        assert [(kinds[c.cell_type], c.source) for c in cells[at : at + 4]] == list(script.CELLS), chapter
        assert all(not c.get("outputs") for c in cells), f"{path} was committed with outputs"
        later = [c.source.split("\n")[0] for c in cells[at + 4 :] if c.cell_type == "markdown"]
        assert all(not line.startswith("## Exercise") for line in later), chapter


def test_the_insert_scripts_are_idempotent_and_place_the_section_before_the_close(tmp_path):
    import shutil

    import nbformat

    for chapter in ("01", "02", "03", "04", "05", "06", "07", "08"):
        script, helper = _chapter_script(chapter)
        (path,) = __import__("glob").glob(f"notebooks/{chapter}_*.ipynb")
        shutil.copy(path, tmp_path)
        assert "already has" in helper.insert(chapter, script.CELLS, script.BEFORE, root=str(tmp_path))
        cells = nbformat.read(str(tmp_path / path.split("/")[-1]), as_version=4).cells
        at = next(i for i, c in enumerate(cells) if c.source.startswith("## Exercise"))
        if script.BEFORE and any(c.source.startswith(script.BEFORE) for c in cells[at + 4 :]):
            assert cells[at + 4].source.startswith(script.BEFORE), chapter
        else:
            assert at + 4 == len(cells), chapter
        assert cells[at + 2].source.startswith("exercises."), chapter
