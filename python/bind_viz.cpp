// Python binding of the viz layer: numpy weights and token lists in, PNG/HTML files out.
// Not the user API: python/attn/viz.py shapes the arguments (contiguous float32, token lists).
#include <pybind11/stl.h>

#include "attn/viz.h"
#include "numpy_view.h"

namespace py = pybind11;
using namespace attn;
using py_util::view_of;

void bind_viz(py::module_& m) {
  m.def(
      "viz_heatmap",
      [](const std::string& path, py::array& weights, const std::vector<std::string>& query_tokens,
         const std::vector<std::string>& key_tokens, const std::string& title, float vmax, int max_px, bool grid) {
        View<const float> w = view_of<const float>(weights, "weights");
        viz::HeatmapOptions opt;
        opt.title = title, opt.vmax = vmax, opt.max_px = max_px;
        viz::HeatmapLayout lay;
        {
          py::gil_scoped_release nogil;
          lay = grid ? viz::write_heads_png(path, w, query_tokens, key_tokens, opt)
                     : viz::write_heatmap_png(path, w, query_tokens, key_tokens, opt);
        }
        py::list panels;
        for (auto [x, y] : lay.panels) panels.append(py::make_tuple(x, y));
        return py::dict(py::arg("width") = lay.width, py::arg("height") = lay.height, py::arg("cell") = lay.cell,
                        py::arg("rows") = lay.rows, py::arg("cols") = lay.cols, py::arg("panels") = panels);
      },
      py::arg("path"), py::arg("weights"), py::arg("query_tokens"), py::arg("key_tokens"), py::arg("title"),
      py::arg("vmax"), py::arg("max_px"), py::arg("grid"),
      "PNG heatmap of weights (L, S), or a grid of all heads (H, L, S); returns the layout.");
  m.def("viz_display_token", &viz::display_token, py::arg("token"), py::arg("max_chars") = 16,
        "A token as a label: valid UTF-8, blanks visible, cut to max_chars code points with an ellipsis.");
  m.def(
      "viz_html",
      [](const std::string& path, std::vector<py::array>& layers, const std::vector<std::string>& query_tokens,
         const std::vector<std::string>& key_tokens, const std::vector<std::string>& layer_names,
         const std::string& title, int top_k, const std::string& scale) {
        viz::AttentionRecord rec{query_tokens, key_tokens, {}, layer_names};
        for (size_t l = 0; l < layers.size(); ++l)
          rec.layers.push_back(view_of<const float>(layers[l], ("layers[" + std::to_string(l) + "]").c_str()));
        py::gil_scoped_release nogil;
        viz::write_html(path, rec, {title, top_k, scale});
      },
      py::arg("path"), py::arg("layers"), py::arg("query_tokens"), py::arg("key_tokens"), py::arg("layer_names"),
      py::arg("title"), py::arg("top_k"), py::arg("scale"),
      "Self-contained interactive HTML page of layers, each (H, L, S).");
}
