"""The tokenizer tests' corpus: tinyshakespeare's lines (the shared data folder beside the checkout; tests
skip without it) and a Unicode stress set. Shared by test_models.py (MiniLM's WordPiece) and
test_bpe.py (byte-level BPE trained here)."""
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "tinyshakespeare.txt"

STRESS = [
    "Café naïve résumé coöperate Ångström façade", "ÀÉÎÕÜ àéîõü ÇÑ", "Straße İstanbul ıi ǅ ﬁ",
    "東京は日本の首都です。北京欢迎你！", "한국어 텍스트 안녕하세요", "日本語とEnglishの混在text",
    "emoji 😀👍🏽 👨‍👩‍👧 🇫🇷 ❤️ 🥰", "tabs\tnew\nlines\r\nand\x0bvertical\x0cfeed",
    "control \x00 \x01 \x07 \x1b \x7f \u0085 chars", "zero\u200bwidth\u200djoiner\ufeffbom \u00ad soft",
    "nbsp\u00a0em\u2003ideographic\u3000space", "replacement \ufffd char", "private \ue000 use \U000f0000",
    "combining e\u0301 a\u0308 o\u0302 \u0301alone", "Ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３", "Ελληνικά Русский עברית العربية",
    "punctuation: «quotes» „low“ ‘single’ —dash– …ellipsis ¿¡ ¶§", "math ∑∫√∞ ≤≥ ± × ÷ $€£¥ ^`|~",
    "[CLS] inside [SEP] text [MASK] and [PAD][UNK]", "a" * 150 + " ok", "", "   ", "x" * 99,
    "don't won't it's I'm we've they're", "U.S.A. e.g. 3.14 1,000,000 #hashtag @user http://x.y/z?q=1",
    "\U0002a700 \U0002b740 \U00020000 \uf900 \u3400",  # CJK extension blocks
    "unassigned x\u0378y \u0e00 \U000e0080", "turkish İı Iİ ΣΑΣ ς", "hangul jamo \u1100\u1161\u11a8 \uac01",
]
# Not in the set: code points assigned after the library's Unicode tables (older than utf8proc's Unicode
# 15), such as U+1ABF (a combining mark since Unicode 14), which the library keeps and attn strips.


def shakespeare_lines():
    if not DATA.exists():
        pytest.skip(f"needs {DATA} (tinyshakespeare, in the shared data folder beside the checkout)")
    return [l for l in DATA.read_text().splitlines() if l.strip()]
