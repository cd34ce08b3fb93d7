"""What a person sees first when the GraphView drawing opens a real export (issue 15): the
GPT-2-like torch export, a DenseNet-like torch export and a PaddleOCR-style graph, drawn by
the widget's own front-end in Chromium (a page with the ES module and a local stand-in for the
widget model: tests/helpers/graph_page.py). Asserts on the items inside the viewport: no
Constant or shape-computation node, the graph's inputs and outputs on screen, groups that open
on double-click (breadcrumbs go back), the Show all toggle, search revealing a node inside a
collapsed group, the minimap beside (never over) the drawing. Screenshots:
``test-artifacts/drawing-*.png``.

Run: ``pytest -m browser tests/browser/test_graph_drawing.py -s``.
"""

from __future__ import annotations

import pytest

from tests.helpers import jupyter

pytestmark = pytest.mark.browser

ROOT = jupyter.ROOT
ARTIFACTS = ROOT / "test-artifacts"
#: ops that are never architecture
NOT_ARCHITECTURE = {"Constant", "Shape", "ConstantOfShape", "Range"}


def _shape_computations(model) -> set:
    """Names of the nodes that compute constants or shapes, found here independently of the
    widget: Constant / Shape / Size nodes and every node all of whose inputs come from them
    or from integer initializers."""
    import numpy as np
    from onnx import numpy_helper

    meta = {
        t.name
        for t in model.graph.initializer
        if not np.issubdtype(numpy_helper.to_array(t).dtype, np.floating)
    }
    out = set()
    for n in model.graph.node:
        ins = [x for x in n.input if x]
        if n.op_type in ("Constant", "Shape", "Size") or (ins and all(x in meta for x in ins)):
            out.add(n.name)
            meta.update(n.output)
    return out


@pytest.fixture(scope="module")
def page(tmp_path_factory, chromium):
    from tests.helpers.graph_page import page_html

    html = tmp_path_factory.mktemp("drawing") / "graph.html"
    html.write_text(page_html(), encoding="utf-8")
    ARTIFACTS.mkdir(exist_ok=True)
    ctx, pg = jupyter.new_page(chromium, 1280, 820)
    pg.goto(html.as_uri())
    pg.wait_for_function("window.wbReady === true")
    yield pg
    ctx.close()


def _open(pg, model, height=680):
    from tests.helpers.graph_page import payload_of
    from workbench.graph.load import load

    data, details = payload_of(load(model, check=False).graph)
    pg.evaluate("([p, d, h]) => wbOpen(p, d, h)", [data, details, height])
    pg.shape_nodes = _shape_computations(model)
    return data


def _visible(pg):
    return pg.evaluate("() => document.querySelector('.wb-graphview').wbView.gc.visibleItems()")


def _view(pg):
    return pg.locator(".wb-graphview")


def _shot(pg, name):
    pg.locator(".wb-graphview").screenshot(path=str(ARTIFACTS / f"drawing-{name}.png"))


def _first_screen_checks(pg, data, name):
    vis = _visible(pg)
    ops = {v["op"] for v in vis if v["type"] == "node"}
    assert not ops & NOT_ARCHITECTURE, (name, ops & NOT_ARCHITECTURE)
    shape = [v["name"] for v in vis if v["type"] == "node" and v["name"] in pg.shape_nodes]
    assert not shape, (name, shape)
    inputs = [v for v in vis if v["type"] == "node" and v["kind"] == 1]
    outputs = [v for v in vis if v["type"] == "node" and v["kind"] == 2]
    n_in = data["kind"].count(1)
    n_out = data["kind"].count(2)
    assert len(inputs) == n_in and all(v["full"] for v in inputs), (name, inputs)
    assert len(outputs) == n_out and all(v["full"] for v in outputs), (name, outputs)
    # the whole first level is on screen, and it is small: the architecture, not the nodes
    assert all(v["full"] for v in vis), [v["label"] for v in vis if not v["full"]]
    assert len(vis) <= 40, len(vis)
    # the minimap sits in the side panel, never over the drawing
    canvas = _view(pg).locator(".wb-canvaswrap").bounding_box()
    mini = _view(pg).locator("canvas.wb-minimap").bounding_box()
    assert mini is None or mini["x"] >= canvas["x"] + canvas["width"]
    return vis


def _dblclick_group(pg, label):
    x, y = pg.evaluate(
        """label => { const gc = document.querySelector('.wb-graphview').wbView.gc;
        const b = gc.lay.items.find(
            (b) => b.it.type === 'group' && gc.graph.G.label[b.it.g] === label);
        const r = gc.canvas.getBoundingClientRect();
        return [r.left + b.x * gc.k + gc.tx, r.top + b.y * gc.k + gc.ty]; }""",
        label,
    )
    pg.mouse.dblclick(x, y)
    pg.wait_for_function(
        "l => document.querySelector('.wb-graphview').dataset.levelLabel === l",
        arg=label,
        timeout=20_000,
    )


def test_gpt2_like_export(page):
    pytest.importorskip("torch")
    from tests.helpers.viewer_models import gpt2_like

    pg = page
    data = _open(pg, gpt2_like())
    assert data["op"].count("Constant") > 130 and len(pg.shape_nodes) > 200
    assert _view(pg).get_attribute("data-layout-worker") == "1"  # dagre ran in a worker
    _shot(pg, "gpt2")
    vis = _first_screen_checks(pg, data, "gpt2")
    blocks = sorted(v["label"] for v in vis if v["type"] == "group")
    assert blocks == ["h.0", "h.1", "h.2", "h.3", "h.4"], blocks  # embeddings -> blocks -> head
    labels = {v["label"] for v in vis}
    assert {"wte: Gather", "ln_f: LayerNormalization", "lm_head: MatMul"} <= labels, labels
    # double-click opens a block; its attention is there, still without shape chains
    _dblclick_group(pg, "h.2")
    _shot(pg, "gpt2-h2")
    inner = _visible(pg)
    assert not {v["op"] for v in inner if v["type"] == "node"} & NOT_ARCHITECTURE
    assert not [v for v in inner if v["type"] == "node" and v["name"] in pg.shape_nodes]
    assert any(v["type"] == "node" and v["op"] == "Softmax" for v in inner)
    assert _view(pg).locator(".wb-crumb").count() == 2
    # double-click a node with a badge: what is folded into it is drawn; again: folded back
    node = "/h.2/attn/Reshape"
    assert data["nfold"][data["name"].index(node)] >= 3

    def dblclick_node(name):
        x, y = pg.evaluate(
            """n => { const gc = document.querySelector('.wb-graphview').wbView.gc;
            const b = gc.itemBoxOf(gc.index.get(n)); const r = gc.canvas.getBoundingClientRect();
            return [r.left + b.x * gc.k + gc.tx, r.top + b.y * gc.k + gc.ty]; }""",
            name,
        )
        pg.mouse.dblclick(x, y)
        pg.wait_for_timeout(400)

    dblclick_node(node)
    ops = {v["op"] for v in _visible(pg) if v["type"] == "node"}
    assert {"Concat", "Shape"} <= ops, ops
    _shot(pg, "gpt2-h2-fold-open")
    dblclick_node(node)
    assert "Concat" not in {v["op"] for v in _visible(pg) if v["type"] == "node"}
    box = _view(pg).locator(".wb-canvaswrap").bounding_box()
    pg.mouse.click(box["x"] + 4, box["y"] + 4)  # empty space: nothing selected
    assert _view(pg).get_attribute("data-selected") == ""
    # Show all: the folded constants and shape computations are drawn too
    pg.click(".wb-showall")
    pg.wait_for_function("() => document.querySelector('.wb-graphview').dataset.showAll === '1'")
    pg.wait_for_timeout(300)
    _dblclick_group(pg, "attn")
    _shot(pg, "gpt2-h2-attn-showall")
    pg.evaluate("() => document.querySelector('.wb-graphview').wbView.gc.fitAll()")
    every = _visible(pg)
    assert {"Constant", "Shape"} <= {v["op"] for v in every if v["type"] == "node"}
    pg.click(".wb-showall")
    # breadcrumbs go back to the whole graph
    _view(pg).locator(".wb-crumb").first.click()
    pg.wait_for_function("() => document.querySelector('.wb-graphview').dataset.level === '0'")
    # search finds a node inside a collapsed block and opens the block to show it
    search = _view(pg).locator("input.wb-search")
    search.fill("/h.3/attn/c_proj/MatMul")
    search.press("Enter")
    pg.wait_for_function(
        "() => document.querySelector('.wb-graphview').dataset.levelLabel === 'h.3'", timeout=20_000
    )
    assert _view(pg).locator(".wb-crumbs").inner_text().split() == ["graph", "›", "h.3"]
    assert any(v.get("name") == "/h.3/attn/c_proj/MatMul" for v in _visible(pg))
    # its path (the edges upstream of it in this group) is highlighted
    assert (
        pg.evaluate("() => document.querySelector('.wb-graphview').wbView.gc.pathEdges.size") >= 1
    )
    _shot(pg, "gpt2-search")
    # a click selects (details from Python's node_details) and does not zoom
    view0 = pg.evaluate(
        "() => { const gc = document.querySelector('.wb-graphview').wbView.gc;"
        " return [gc.k, gc.tx, gc.ty]; }"
    )
    x, y = pg.evaluate("""() => { const gc = document.querySelector('.wb-graphview').wbView.gc;
        const b = gc.itemBoxOf(gc.index.get('/h.3/attn/c_proj/MatMul'));
        const r = gc.canvas.getBoundingClientRect();
        return [r.left + b.x * gc.k + gc.tx, r.top + b.y * gc.k + gc.ty]; }""")
    pg.mouse.click(x, y)
    assert _view(pg).get_attribute("data-selected") == "/h.3/attn/c_proj/MatMul"
    assert "INPUTS" in _view(pg).locator(".wb-details").inner_text().upper()
    assert (
        pg.evaluate(
            "() => { const gc = document.querySelector('.wb-graphview').wbView.gc;"
            " return [gc.k, gc.tx, gc.ty]; }"
        )
        == view0
    )  # no zoom, no jump
    # keys zoom; once the level is bigger than the view the minimap shows (beside the
    # drawing), and it can be hidden
    _view(pg).locator(".wb-canvaswrap").focus()
    for _ in range(4):
        pg.keyboard.press("+")
    pg.keyboard.press("ArrowDown")
    pg.wait_for_timeout(100)
    mini = _view(pg).locator("canvas.wb-minimap")
    assert mini.is_visible()
    canvas = _view(pg).locator(".wb-canvaswrap").bounding_box()
    assert mini.bounding_box()["x"] >= canvas["x"] + canvas["width"]
    pg.click(".wb-maptoggle")
    assert not mini.is_visible()
    assert pg.errors == [], pg.errors


def test_densenet_like_export(page):
    pytest.importorskip("torch")
    from tests.helpers.viewer_models import densenet_like

    pg = page
    data = _open(pg, densenet_like())
    assert "ConstantOfShape" in data["op"] and pg.shape_nodes
    _shot(pg, "densenet")
    vis = _first_screen_checks(pg, data, "densenet")
    groups = {v["label"] for v in vis if v["type"] == "group"}
    assert {"denseblock1", "transition1", "denseblock2", "transition2", "denseblock3"} <= groups
    _dblclick_group(pg, "denseblock2")
    inner = _visible(pg)
    assert {v["label"] for v in inner if v["type"] == "group"} >= {"denselayer1", "denselayer4"}
    _dblclick_group(pg, "denselayer1")
    assert {"Conv", "BatchNormalization", "Relu", "Concat"} <= {
        v["op"] for v in _visible(pg) if v["type"] == "node"
    }
    _shot(pg, "densenet-denselayer")
    assert pg.errors == [], pg.errors


def test_paddle_ocr_style_graph(page):
    from tests.helpers.viewer_models import paddle_ocr_like

    pg = page
    data = _open(pg, paddle_ocr_like())
    assert data["op"].count("Constant") >= 141 and len(pg.shape_nodes) >= 141
    _shot(pg, "paddle")
    vis = _first_screen_checks(pg, data, "paddle")
    parts = [v for v in vis if v["type"] == "group"]
    assert len(parts) >= 3 and all(" · " in v["label"] for v in parts)
    _dblclick_group(pg, parts[0]["label"])
    inner = _visible(pg)
    assert "Conv" in {v["op"] for v in inner if v["type"] == "node"}
    assert not {v["op"] for v in inner if v["type"] == "node"} & NOT_ARCHITECTURE
    assert not [v for v in inner if v["type"] == "node" and v["name"] in pg.shape_nodes]
    _shot(pg, "paddle-part1")
    assert pg.errors == [], pg.errors


def test_overlay_and_export(page, tmp_path):
    """A profile overlay colours the nodes with a legend; the view saves as SVG and PNG."""
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "widgets"))
    import synth

    pg = page
    _open(pg, synth.cnn(), height=520)
    before = pg.evaluate(
        "() => { const gc = document.querySelector('.wb-graphview').wbView.gc;"
        " return gc.fillOf(gc.index.get('conv1')); }"
    )
    pg.evaluate("""() => wbModel.set('overlay', {title: 'time per node', unit: 'ms',
        values: {conv1: 4.0, relu1: 0.5, pool1: 1.0, flatten: 0.1, fc: 2.0}, flagged: ['fc']})""")
    legend = _view(pg).locator(".wb-overlay-legend")
    text = legend.text_content()
    assert "time per node" in text and "4.00 ms" in text and "1 node ringed" in text, text
    after = pg.evaluate(
        "() => { const gc = document.querySelector('.wb-graphview').wbView.gc;"
        " return [gc.fillOf(gc.index.get('conv1')), gc.fillOf(gc.index.get('flatten'))]; }"
    )
    assert after[0] != before and after[0] != after[1]  # the slowest node is the darkest
    _shot(pg, "overlay")
    with pg.expect_download() as dl:
        pg.click(".wb-export-svg")
    svg_path = tmp_path / "view.svg"
    dl.value.save_as(svg_path)
    svg = svg_path.read_text()
    assert svg.startswith("<svg") and "Conv" in svg and "Gemm" in svg and "float32" in svg
    with pg.expect_download() as dl:
        pg.click(".wb-export-png")
    png_path = tmp_path / "view.png"
    dl.value.save_as(png_path)
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png_path.stat().st_size > 2000
    pg.evaluate("() => wbModel.set('overlay', {})")
    assert _view(pg).locator(".wb-overlay-legend").count() == 0
    assert pg.errors == [], pg.errors


def test_subgraphs_open_like_groups(page):
    """Double-clicking an If node opens its branches; a branch opens like a group."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    then_g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["t"], name="then_relu")],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])],
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"], name="else_neg")],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])],
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
        helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g, else_branch=else_g),
    ]
    g = helper.make_graph(
        nodes,
        "ifg",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.float32(0), "zero")],
    )
    pg = page
    _open(pg, helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), height=480)
    x, y = pg.evaluate("""() => { const gc = document.querySelector('.wb-graphview').wbView.gc;
        const b = gc.itemBoxOf(gc.index.get('branch')); const r = gc.canvas.getBoundingClientRect();
        return [r.left + b.x * gc.k + gc.tx, r.top + b.y * gc.k + gc.ty]; }""")
    pg.mouse.dblclick(x, y)
    pg.wait_for_function(
        "() => document.querySelector('.wb-graphview').dataset.levelLabel === 'branch'"
    )
    vis = _visible(pg)
    assert sorted(v["label"] for v in vis if v["type"] == "group") == [
        "branch · else_branch",
        "branch · then_branch",
    ]
    assert [v["label"] for v in vis if v["type"] == "stub"] == ["from x"]  # read from outside
    _dblclick_group(pg, "branch · then_branch")
    vis = _visible(pg)
    assert {v["label"] for v in vis} >= {"Relu", "from x", "t"}
    _shot(pg, "subgraph")
    assert pg.errors == [], pg.errors


def _tall_model(blocks=36, d=8):
    """A residual MLP of ``blocks`` scoped blocks (``/block.i/...``): a first level taller than
    a readable fit, as deep exports (24-layer transformers, ResNet-152) draw."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(blocks):
        s = f"/block.{i}"
        w = numpy_helper.from_array(rng.standard_normal((d, d)).astype(np.float32), f"w{i}")
        inits.append(w)
        nodes += [helper.make_node("MatMul", [x, w.name], [f"{s}/mm"], name=f"{s}/MatMul"),
                  helper.make_node("Relu", [f"{s}/mm"], [f"{s}/r"], name=f"{s}/Relu"),
                  helper.make_node("Add", [x, f"{s}/r"], [f"{s}/out"], name=f"{s}/Add")]
        x = f"{s}/out"
    nodes.append(helper.make_node("Identity", [x], ["y"], name="/head/Identity"))
    g = helper.make_graph(nodes, "tall", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         [1, d])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, d])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _ends_shown(pg):
    vis = _visible(pg)
    return ([v["full"] for v in vis if v["type"] == "node" and v["kind"] == 1],
            [v["full"] for v in vis if v["type"] == "node" and v["kind"] == 2])


def test_a_tall_graph_opens_on_its_inputs_with_its_outputs_one_click_away(page):
    """Too tall to fit readably: the first screen shows the inputs at a readable zoom and a
    visible '▼ 1 output below' control; one click shows the outputs (the zoom kept) and
    offers the way back ('▲ 1 input above', key Home); End goes down again."""
    pg = page
    _open(pg, _tall_model(), height=560)
    k0 = pg.evaluate("() => document.querySelector('.wb-graphview').wbView.gc.k")
    assert k0 >= 0.45, k0                                          # readable, not a far fit
    ins, outs = _ends_shown(pg)
    assert ins == [True], "the inputs are on the first screen"
    assert outs == [], "this model is meant to be taller than one screen"
    down, up = _view(pg).locator(".wb-jump-out"), _view(pg).locator(".wb-jump-in")
    assert down.is_visible() and down.inner_text() == "▼ 1 output below"
    assert not up.is_visible()
    _shot(pg, "tall-first-screen")
    down.click()
    assert _ends_shown(pg)[1] == [True], "one click shows the output"
    assert pg.evaluate("() => document.querySelector('.wb-graphview').wbView.gc.k") == k0
    assert not down.is_visible() and up.is_visible() and up.inner_text() == "▲ 1 input above"
    _shot(pg, "tall-outputs")
    _view(pg).locator(".wb-canvaswrap").focus()
    pg.keyboard.press("Home")
    assert _ends_shown(pg)[0] == [True] and down.is_visible() and not up.is_visible()
    pg.keyboard.press("End")
    assert _ends_shown(pg)[1] == [True]
    # a graph that fits has neither control
    _open(pg, _tall_model(blocks=3), height=560)
    assert _ends_shown(pg) == ([True], [True])
    assert not down.is_visible() and not up.is_visible()
    assert not pg.errors, pg.errors
