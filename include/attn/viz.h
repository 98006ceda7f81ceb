// Seeing what the heads learned: PNG heatmaps (Cairo) and one self-contained interactive HTML page.
// Not a model runner: callers hand in attention weights they already have (e.g. SdpaOut::weights) and
// the token strings; nothing here computes attention, reads a checkpoint or touches the network.
#pragma once
#include <string>
#include <vector>

#include "attn/tensor.h"

namespace attn::viz {

// ---- tokens -------------------------------------------------------------------------------------

// `s` with every invalid UTF-8 sequence replaced by U+FFFD, so it can go into JSON and Cairo.
std::string valid_utf8(const std::string& s);
// A token as a label: valid UTF-8, newline/tab/CR as the symbols ⏎ ⇥ ␍, other control characters as
// U+2400 pictures, an all-space token as ␣, cut to `max_chars` code points with "…".
std::string display_token(const std::string& token, int max_chars = 16);

// ---- PNG heatmaps -------------------------------------------------------------------------------

struct HeatmapOptions {
  std::string title;    // empty: "attention" for one head, "all heads" for a grid
  // <= 0: the scale rule of every view (the HTML's too): each query row is drawn relative to its own
  // largest weight (darkest), so a causal view's first rows (one key, weight 1) do not pale the rest; the
  // colour bar says so. > 0: one absolute scale, 0 to vmax, for the whole picture.
  float vmax = 0.f;
  int max_px = 1024;    // longest side of one matrix in pixels; longer inputs are max-pooled to fit
  int max_cell = 40;    // cell side in pixels for short inputs
  int columns = 0;      // grid only: panels per row; 0: about sqrt(H)
};

// Where things are in the image, so callers (and tests) can find a cell: cell (i, j) of panel p has
// its top-left corner at (panels[p].x + j * cell, panels[p].y + i * cell). rows/cols are the drawn
// grid: L and S, or fewer when a long input was max-pooled (each drawn cell then covers several).
struct HeatmapLayout {
  struct Origin { double x, y; };
  int width = 0, height = 0;  // the PNG, pixels
  double cell = 0;            // cell side, pixels
  int rows = 0, cols = 0;     // drawn cells per panel (<= L, S)
  std::vector<Origin> panels;  // one per head drawn
};

// One head: weights (L, S), any strides; query_tokens has L entries; key_tokens S entries, or is
// empty for self-attention (then L == S and the query tokens label the keys). Returns the layout.
HeatmapLayout write_heatmap_png(const std::string& path, View<const float> weights,
                                const std::vector<std::string>& query_tokens,
                                const std::vector<std::string>& key_tokens = {},
                                const HeatmapOptions& options = {});
// All heads of one layer side by side: weights (H, L, S), one shared colour scale.
HeatmapLayout write_heads_png(const std::string& path, View<const float> weights,
                              const std::vector<std::string>& query_tokens,
                              const std::vector<std::string>& key_tokens = {},
                              const HeatmapOptions& options = {});

// ---- attention rollout ---------------------------------------------------------------------------

// Attention rollout (Abnar & Zuidema 2020): how much of each token's input reaches each position through
// all the layers so far, the residual counted. Per layer l, Â_l = 0.5·mean over heads of layers[l] + 0.5·I
// with each row renormalised to sum to 1, and R_0 = Â_0, R_l = Â_l · R_{l-1} (sums in double). layers:
// self-attention weights, each (H, T, T) (H may differ between layers). Returns R_l for every l, each (T, T):
// row i is position i's mix of the input tokens after layer l.
std::vector<Tensor> attention_rollout(const std::vector<View<const float>>& layers);

// ---- interactive HTML ---------------------------------------------------------------------------

// What one forward pass attended to. Self-attention: key_tokens empty. The record does not own the
// weights: each layers[l] is a view (H, L, S) (any strides; H may differ between layers) that must
// outlive the write_html call.
struct AttentionRecord {
  std::vector<std::string> query_tokens;  // L
  std::vector<std::string> key_tokens;    // S, or empty: same as query_tokens
  std::vector<View<const float>> layers;  // each (H, L, S)
  std::vector<std::string> layer_names;   // empty, or one per layer ("decoder 2 · cross"); default "layer l"
};

struct HtmlOptions {
  std::string title = "attention";
  // Per query row, keep only the top_k largest weights (ties: lower key index). 0 keeps all; -1
  // (auto) keeps all when S <= 64 and 16 otherwise. The page says when weights were dropped.
  int top_k = -1;
  // The colour scale the page opens with (a control on the page switches): "row", each query row relative
  // to its largest weight (a diffuse head looks as dark as a sharp one), or "absolute", 0 to 1 for every
  // row (bertviz's: a diffuse head looks pale). Every view says which it shows.
  std::string scale = "row";
};

// The page as a string: inline CSS and JS, the data as inline JSON in <script id="attn-data">;
// no URL of any kind. Head view (bertviz-style lines), model view (layers x heads thumbnails),
// matrix view (labelled heatmap) and, for self-attention, the rollout view (attention_rollout of the
// layers, through the layer chosen).
std::string render_html(const AttentionRecord& record, const HtmlOptions& options = {});
void write_html(const std::string& path, const AttentionRecord& record, const HtmlOptions& options = {});

}  // namespace attn::viz
