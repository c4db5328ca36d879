"""One stale-state rule for every dashboard (chapter 8's): settings the calculators refuse leave each
figure they drive as it was, "(stale)" after its title, a red line saying why; the next valid
settings redraw it without the mark. And a control that does nothing in the current settings is
disabled, with a tooltip saying when it counts. Driven through the widgets, no browser."""

from playbook.viz.widgets import STALE, is_stale


def test_pipeline_explorer_marks_a_refused_schedule_stale_and_recovers():
    from playbook.viz.pp_dashboard import pipeline_explorer

    box = pipeline_explorer(p=4, m=8, schedule="1f1b")
    drawn = box.figure.layout.title.text
    box.controls["schedule"].value = "dualpipe-v"
    box.controls["m"].value = 4  # dualpipe-v needs m >= 2p = 8
    assert "Not a valid schedule" in box.message.value and "m &gt;= 2p" in box.message.value
    assert box.figure.layout.title.text.startswith("dualpipe-v: p=4, m=8") and is_stale(box.figure)
    assert not is_stale(box.bubble_figure)  # bubble vs m does not depend on m: still the current p and v
    box.controls["p"].value = 5  # refused too, and bubble vs m is not redrawn for the new p
    assert is_stale(box.bubble_figure)
    box.controls["m"].value = 10
    assert "p=5, m=10" in box.figure.layout.title.text and not is_stale(box.figure)
    assert "p=5" in box.bubble_figure.layout.title.text and not is_stale(box.bubble_figure)
    assert STALE not in drawn


def test_cp_dashboard_subtitle_never_names_settings_it_did_not_draw():
    from playbook.viz.cp_dashboard import cp_dashboard

    box = cp_dashboard(model="llama-3.1-8b", n=4, variant="ring")
    box.controls["model"].value = "gpt-tiny"  # 4 query heads, 2 KV heads
    box.controls["variant"].value = "ulysses"  # cp=4 cannot split 2 KV heads
    assert "Cannot do" in box.message.value and is_stale(box.figure)
    assert box.figure.layout.title.text.startswith("ring, n=4")  # the last drawing, and it says so
    box.controls["n"].value = 2
    title = box.figure.layout.title.text
    assert title.startswith("ulysses, n=2") and "gpt-tiny on h100-sxm" in title and not is_stale(box.figure)


def test_routing_dashboard_marks_top_k_above_the_experts_stale():
    from playbook.viz.ep_dashboard import routing_dashboard

    box = routing_dashboard(n_experts=4, top_k=2)
    top_k, fig = box.children[0].children[1], box.children[-1]
    experts = box.children[0].children[0]
    experts.value = 2
    top_k.value = 3
    assert "Cannot route" in box.children[2].value and is_stale(fig)
    top_k.value = 2
    assert not is_stale(fig) and "2 experts, top-2" in fig.layout.title.text


def test_tp_dashboard_disables_saving_shards_while_sp_is_off():
    from playbook.viz.tp_dashboard import tp_dashboard

    box = tp_dashboard(model="llama-3.1-8b", tp=8, sequence_parallel=True, regather=True)
    regather, sp = box.controls["regather"], box.controls["sequence_parallel"]
    assert not regather.disabled and "TP+SP (shards saved)" in box.figures["memory"].layout.title.text
    sp.value = False
    assert regather.disabled and "sequence parallel" in regather.tooltip
    assert "shards saved" not in box.figures["memory"].layout.title.text
    assert "re-gather the saved shards" not in box.message.value
    sp.value = True  # the box stayed ticked: saving shards comes back with SP
    assert not regather.disabled and "TP+SP (shards saved)" in box.figures["memory"].layout.title.text
