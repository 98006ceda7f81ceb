"""attn.viz from Python: PNGs read back pixel by pixel (a small PNG decoder below, no Pillow), the
HTML page's embedded JSON parsed back and compared bit for bit with the float32 weights given."""
import json
import re
import struct
import zlib

import numpy as np
import pytest

import attn

# The scale's ends: weight 0 is #f7fbff (luma 0.98), the largest weight #08306b (luma 0.17).
LIGHT, DARK = 0.9, 0.3


def read_png(path):
    """(height, width, channels) uint8 array of an 8-bit, non-interlaced RGB or RGBA PNG."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (n,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    ch = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(idat), width * ch
    out = np.zeros((height, stride), np.int32)
    prev = np.zeros(stride, np.int32)
    for y in range(height):
        f, line = raw[y * (stride + 1)], np.frombuffer(raw, np.uint8, stride, y * (stride + 1) + 1).astype(np.int32)
        cur = line.copy()
        if f == 2:  # Up
            cur = (line + prev) & 255
        elif f in (1, 3, 4):  # Sub, Average, Paeth need the left neighbour: byte by byte
            for x in range(stride):
                a = cur[x - ch] if x >= ch else 0
                b, c = prev[x], prev[x - ch] if x >= ch else 0
                if f == 1:
                    pred = a
                elif f == 3:
                    pred = (a + b) // 2
                else:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                cur[x] = (line[x] + pred) & 255
        out[y], prev = cur, cur
    return out.reshape(height, width, ch)[:, :, :3].astype(np.uint8)


def cell_luma(img, layout, i, j, panel=0):
    x0, y0 = layout["panels"][panel]
    c = layout["cell"]
    r, g, b = img[int(y0 + (i + 0.5) * c), int(x0 + (j + 0.5) * c)].astype(float)
    return (0.299 * r + 0.587 * g + 0.114 * b) / 255


def softmax_rows(shape, seed):
    x = np.random.default_rng(seed).normal(0, 2, shape)
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def embedded(path):
    html = open(path, encoding="utf-8").read()
    m = re.search(r'<script type="application/json" id="attn-data">(.*?)</script>', html, re.S)
    assert m, "no embedded data"
    return html, json.loads(m.group(1))


def test_identity_heatmap_is_dark_on_the_diagonal(tmp_path):
    n = 6
    path = tmp_path / "eye.png"
    layout = attn.viz.heatmap(path, np.eye(n), ["a", "b", "<c>", '"d"', "\n", "é"], title="layer 0 · head 3")
    img = read_png(path)
    assert img.shape[:2] == (layout["height"], layout["width"])
    assert (layout["rows"], layout["cols"]) == (n, n)
    for i in range(n):
        for j in range(n):
            y = cell_luma(img, layout, i, j)
            assert (y < DARK) if i == j else (y > LIGHT), (i, j, y)


def test_cross_attention_heatmap_and_grid(tmp_path):
    w = softmax_rows((3, 4, 7), 0)  # (H, L, S)
    q, k = "abcd", ["k0", "k1", "k2", "k3", "k4", "k5", "k6"]  # a str is one token per character
    one = attn.viz.heatmap(tmp_path / "one.png", w[1], q, k)
    img = read_png(tmp_path / "one.png")
    assert img.shape[:2] == (one["height"], one["width"]) and (one["rows"], one["cols"]) == (4, 7)
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 30  # not blank
    i, j = np.unravel_index(np.argmax(w[1]), w[1].shape)
    assert cell_luma(img, one, i, j) < DARK
    grid = attn.viz.heatmap(tmp_path / "grid.png", w, q, k)
    img = read_png(tmp_path / "grid.png")
    assert img.shape[:2] == (grid["height"], grid["width"]) and len(grid["panels"]) == 3
    for h in range(3):  # each panel is its head: the head's weakest cell is lighter than its strongest
        lo = np.unravel_index(np.argmin(w[h]), w[h].shape)
        hi = np.unravel_index(np.argmax(w[h]), w[h].shape)
        assert cell_luma(img, grid, *lo, panel=h) > cell_luma(img, grid, *hi, panel=h)


def test_heatmap_takes_torch_tensors_and_strided_arrays(tmp_path):
    import torch  # a project dependency (install-deps.sh): no skip
    w = torch.eye(5).t()  # a transposed view
    layout = attn.viz.heatmap(tmp_path / "t.png", w, list("hello"))
    img = read_png(tmp_path / "t.png")
    assert cell_luma(img, layout, 2, 2) < DARK and cell_luma(img, layout, 2, 3) > LIGHT
    layout = attn.viz.heatmap(tmp_path / "s.png", np.eye(10)[::2, ::2], list("abcde"))
    assert cell_luma(read_png(tmp_path / "s.png"), layout, 4, 4) < DARK


def test_heatmap_errors_are_clear(tmp_path):
    with pytest.raises(attn.AttnError, match=r"\(3, 5\)"):
        attn.viz.heatmap(tmp_path / "x.png", np.ones((3, 5)), list("abc"))  # self-attention needs L == S
    with pytest.raises(attn.AttnError, match="query_tokens"):
        attn.viz.heatmap(tmp_path / "x.png", np.ones((3, 5)), list("ab"), list("abcde"))
    with pytest.raises(attn.AttnError, match="shape"):
        attn.viz.heatmap(tmp_path / "x.png", np.ones(5), list("abcde"))


def test_html_embeds_exactly_the_weights(tmp_path):
    w = softmax_rows((2, 3, 5, 5), 1)  # (layers, H, L, S)
    w[0, 0, 0, 0] = np.float32(0.1)
    w[1, 2, 4, 4] = np.float32(1e-30)
    path = attn.viz.html(tmp_path / "p.html", w, ["The", "cat", "sat", "on", "mats"], title="demo")
    html, data = embedded(path)
    assert data["self"] is True and data["top_k"] is None and data["L"] == data["S"] == 5
    assert data["query_tokens"] == data["key_tokens"] == ["The", "cat", "sat", "on", "mats"]
    assert data["layer_names"] == ["layer 0", "layer 1"]
    got = np.array([[head["w"] for head in layer] for layer in data["layers"]], dtype=np.float64)
    np.testing.assert_array_equal(got.astype(np.float32), w)  # bit-exact after float32 rounding
    low = html.lower()
    for bad in ("http://", "https://", "//cdn", "<link", 'src="http', "@import", "url("):
        assert bad not in low, bad


def test_html_layers_as_a_list_with_different_heads_and_cross_attention(tmp_path):
    layers = [softmax_rows((2, 3, 4), 2), softmax_rows((5, 3, 4), 3)]
    _, data = embedded(attn.viz.html(tmp_path / "c.html", layers, ["q0", "q1", "q2"], ["k0", "k1", "k2", "k3"],
                                     layer_names=["enc", "dec"]))
    assert data["self"] is False and data["layer_names"] == ["enc", "dec"]
    assert [len(x) for x in data["layers"]] == [2, 5]
    for layer, want in zip(data["layers"], layers):
        np.testing.assert_array_equal(np.array([h["w"] for h in layer]).astype(np.float32), want)


def test_html_top_k_keeps_each_rows_largest(tmp_path):
    w = softmax_rows((2, 6, 100), 4)  # S = 100 > 64: 16 per row by default
    _, data = embedded(attn.viz.html(tmp_path / "k.html", [w], [f"q{i}" for i in range(6)],
                                     [f"k{j}" for j in range(100)]))
    assert data["top_k"] == 16
    for h in range(2):
        for i in range(6):
            want = np.sort(np.argsort(-w[h, i], kind="stable")[:16])
            assert data["layers"][0][h]["k"][i] == want.tolist()
            np.testing.assert_array_equal(np.float32(data["layers"][0][h]["w"][i]), w[h, i, want])
    kept = np.mean([np.sort(w[h, i])[-16:].sum() / w[h, i].sum() for h in range(2) for i in range(6)])
    assert data["kept_mass"] == pytest.approx(kept, rel=1e-6)
    _, data = embedded(attn.viz.html(tmp_path / "k.html", [w], [f"q{i}" for i in range(6)],
                                     [f"k{j}" for j in range(100)], top_k=0))
    assert data["top_k"] is None and len(data["layers"][0][0]["w"][0]) == 100


def test_html_hostile_tokens_stay_data(tmp_path):
    toks = ["</script><script>alert(1)</script>", '"', "a\nb", "<!--", "&amp;", "\\", "\u2028", "<b>x</b>"]
    w = softmax_rows((1, 8, 8), 5)
    html, data = embedded(attn.viz.html(tmp_path / "h.html", [w], toks, title="</title><script>"))
    assert html.lower().count("</script") == 2 and "<!--" not in html
    assert data["query_tokens"] == toks and data["title"] == "</title><script>"
    assert "<title>&lt;/title&gt;&lt;script&gt;</title>" in html


def test_html_with_weights_from_attn_sdpa(tmp_path):
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((1, 2, 6, 8), dtype=np.float32) for _ in range(3))
    _, weights = attn.scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)
    _, data = embedded(attn.viz.html(tmp_path / "s.html", [weights[0]], "hello!"))
    got = np.array([h["w"] for h in data["layers"][0]]).astype(np.float32)
    np.testing.assert_array_equal(got, weights[0])
    assert np.all(got[:, np.triu_indices(6, 1)[0], np.triu_indices(6, 1)[1]] == 0)  # causal: zeros above


def test_html_errors_are_clear(tmp_path):
    with pytest.raises(attn.AttnError, match=r"\(2, 3, 5\)"):
        attn.viz.html(tmp_path / "e.html", [np.ones((2, 3, 5), np.float32)], list("abc"), list("abcd"))
    with pytest.raises(attn.AttnError, match="num_layers"):
        attn.viz.html(tmp_path / "e.html", np.ones((3, 5), np.float32), list("abc"))


def test_html_refuses_a_head_averaged_batch_and_wrong_ranks(tmp_path):
    mha = attn.MultiheadAttention(8, 2, batch_first=True, seed=0)
    x = np.random.default_rng(0).standard_normal((2, 5, 8), dtype=np.float32)
    _, w = mha(x, x, x)  # (N, L, S): averaged over heads, one matrix per batch item
    with pytest.raises(attn.AttnError, match=r"head-averaged weights of shape \(2, 5, 5\) \(N, L, S.*"
                                             r"average_attn_weights=False and pass w\[n\]"):
        attn.viz.html(tmp_path / "v.html", [w], list("hello"))
    with pytest.raises(attn.AttnError, match=r"Expected layer 1 of weights \(H, L, S\), but got shape \(5, 5\)"):
        attn.viz.html(tmp_path / "v.html", [np.ones((2, 5, 5)), np.ones((5, 5))], list("hello"))
    with pytest.raises(attn.AttnError, match=r"Expected layers of shape \(num_layers, H, L, S\) or a list of "
                                             r"\(H, L, S\) "
                                             r"arrays, but got MultiheadAttention's head-averaged weights of shape "
                                             r"\(2, 5, 5\)"):
        attn.viz.html(tmp_path / "v.html", w, list("hello"))  # the batch itself, not in a list
    _, w = mha(x, x, x, average_attn_weights=False)  # (N, H, L, S): w[0] is one layer's heads
    assert attn.viz.html(tmp_path / "v.html", [w[0]], list("hello")) == tmp_path / "v.html"


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_html_refuses_one_three_dimensional_array(tmp_path, kind):
    """(H, L, S) heads and an (N, L, S) batch (torch's head-averaged MultiheadAttention weights) have the same
    rank: a bare 3-D array is refused with what to pass instead, and never drawn as heads."""
    w = softmax_rows((2, 5, 5), 7)
    if kind == "torch":
        import torch  # a project dependency (install-deps.sh): no skip
        w = torch.from_numpy(w)
    with pytest.raises(attn.AttnError, match=r"Expected layers of shape \(num_layers, H, L, S\) or a list of "
                                             r"\(H, L, S\) "
                                             r"arrays, but got one array of shape \(2, 5, 5\) instead: .*\(N, L, S\).*"
                                             r"pass \[w\]"):
        attn.viz.html(tmp_path / "b.html", w, list("hello"))
    assert not (tmp_path / "b.html").exists()
    with pytest.raises(attn.AttnError, match=r"Expected layers of shape .* but got \(2, 5, 5, 1, 1\) instead"):
        attn.viz.html(tmp_path / "b.html", np.ones((2, 5, 5, 1, 1), np.float32), list("hello"))
    _, data = embedded(attn.viz.html(tmp_path / "b.html", [w], list("hello")))  # the same heads in a list: drawn
    assert len(data["layers"]) == 1 and len(data["layers"][0]) == 2
