"""Chapter 7's exercise: KV-cache capacity by hand (checked by ``playbook.exercises.serving``)."""

from _insert import insert, solution_markdown

from playbook.exercises import serving

BEFORE = "## What to remember"  # the chapter's closing section
CELLS = [
    (
        "md",
        "## Exercise: KV-cache capacity by hand\n\n"
        "Write `capacity(cfg, hw, context, tp)` returning `(kv_bytes_per_token, max_seqs)` for one GPU of a "
        "tensor-parallel replica in bf16: the KV bytes one token occupies on that GPU, and how many sequences "
        "of `context` tokens its cache holds when the cache gets what the weights (2 bytes per parameter, "
        "split over tp) and the activation peak of one `context`-token forward leave of 90% of the memory "
        "the device reports, in blocks of 16 tokens. The activation peak is given: "
        "`serving.activation_peak(cfg, tokens=context, tp=tp)`, what vLLM's profiling run measures (§1). "
        "The check compares with `playbook.theory.serving.serving.kv_capacity` and with a real bf16 cache "
        "block of the model's shape.\n\n"
        "*Hint:* `cfg.n_layers`, `cfg.kv_heads`, `cfg.dim_head`, `cfg.num_params()`, `hw.capacity_bytes`. "
        "What does each layer cache per token, and per KV head? And when tp exceeds the KV heads, serving "
        "engines replicate them: each GPU keeps one whole KV head.",
    ),
    (
        "code",
        "from playbook import exercises\n"
        "from playbook.exercises import NotYetWritten\n\n\n"
        "def capacity(cfg, hw, context, tp):\n"
        '    """(KV bytes per token on one GPU, sequences of `context` tokens that fit), bf16."""\n'
        '    raise NotYetWritten("capacity")  # replace this line with your code',
    ),
    ("code", "exercises.serving.check(capacity)"),
    ("md", solution_markdown((serving.solution, "capacity"))),
]

if __name__ == "__main__":
    print(insert("07", CELLS, before=BEFORE))
