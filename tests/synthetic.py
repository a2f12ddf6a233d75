"""Deterministic generator of a synthetic, Tulu-3-SFT-like chat corpus.

Used by the test suite, the benchmarks and the fuzz script, so it is
self-contained (stdlib + pyarrow only; no network, no data files) and fast:
20,000 conversations (~50 M characters) take about 1.5 s, plus ~0.5 s once
per process to build the unit pools (under 2.5 s cold in total).

Rules
-----
* Rows follow the Tulu 3 SFT mixture schema: ``{"id": str, "messages":
  [{"role": str, "content": str}, ...], "source": str}``.
* ``id`` is ``f"synthetic_{i}"`` (row index ``i``), unique within one call;
  ``source`` is ``f"synthetic/{kind}"`` for the row's main content kind
  (see :data:`KINDS`).
* ``messages``: an optional leading ``"system"`` message, then strictly
  alternating ``"user"`` / ``"assistant"`` messages starting with ``"user"``.
  Almost every conversation ends with ``"assistant"``; a small fraction ends
  with ``"user"``. A conversation has 1 to 12 user turns.
* All content is built from word lists and syllable generators written in
  this file and drawn with :class:`random.Random` only (never numpy), so the
  output is identical across platforms and numpy versions. Messages are
  assembled from pools of pre-generated units (sentences, clauses, code
  blocks, math lines) that are themselves built from fixed seeds.
* Content mix: English prose (markdown headings, lists, quotes), Python /
  JavaScript / bash / JSON / SQL / Makefile code in fences, math (LaTeX and
  numbers), Chinese, Japanese, Korean, Russian, Arabic, German, French,
  emoji (astral, skin tones, ZWJ sequences, flags, tags), combining marks
  (zalgo, NFD, Vietnamese, Devanagari, Thai) and mixtures of all of them.
  About 15% of rows have a system prompt, ~1% of assistant messages are
  empty, ~0.4% of rows hold one 20,000-60,000 character assistant message,
  a few percent of messages use ``"\r\n"`` or carry leading/trailing
  whitespace.
* Row ``i`` depends only on ``(seed, i)`` (it is drawn from
  ``random.Random(f"{seed}:{i}")``), hence ``conversations(n, seed)`` is a
  prefix of ``conversations(n + k, seed)``.
* Every string is valid Unicode without lone surrogates, so it encodes to
  UTF-8 and stores in Parquet/JSON unchanged.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "KINDS",
    "TULU_SCHEMA",
    "MESSAGE_TYPE",
    "conversations",
    "conversation",
    "hard_strings",
    "hard_conversations",
    "write_parquet",
    "write_jsonl",
    "read_jsonl",
]

# --------------------------------------------------------------------------
# Word lists / character pools (all inline)
# --------------------------------------------------------------------------

_EN_WORDS: tuple[str, ...] = tuple(
    """
the of and to in a is that for it as was with be by on not he this are or
his from at which but have an they you were her she there been one all we
their has would when if so what can more will about up out them some could
into than its time only other new two may first any these like then now
people also just over such most after well made through where much before
back between those own same being both under while last might great still
every never many long world system data model process value result example
number because each during without again against problem question answer
function method approach idea reason study research analysis language
science history market energy water health city country government policy
company product service customer team project design development program
software network computer information knowledge education student teacher
school family community public private important different possible common
general specific simple complex large small early late recent modern local
global natural social economic political cultural physical digital human
animal plant river mountain ocean forest garden village island weather
season morning evening night summer winter spring autumn music art book
story film game sport food kitchen recipe bread coffee travel journey road
bridge train station airport hotel museum library hospital doctor patient
treatment medicine memory attention learning training evaluation benchmark
dataset token sequence length window batch gradient optimizer parameter
layer neural transformer attention embedding vector matrix tensor memory
experiment hypothesis theory evidence observation measurement accuracy
precision error bias variance sample distribution probability statistics
carefully quickly slowly clearly easily often usually sometimes rarely
always therefore however moreover although whereas meanwhile instead
consider explain describe compare improve reduce increase provide create
build write read understand remember choose follow change develop support
""".split()
)

_EN_CONNECTORS: tuple[str, ...] = (
    "In addition,",
    "However,",
    "For example,",
    "As a result,",
    "In practice,",
    "Note that",
    "First,",
    "Second,",
    "Finally,",
    "In short,",
    "Overall,",
    "On the other hand,",
    "Importantly,",
    "To summarize,",
    "Historically,",
)

_USER_OPENERS: tuple[str, ...] = (
    "Can you explain",
    "Please describe",
    "Write a short essay about",
    "What is the difference between",
    "Summarize the following:",
    "I need help with",
    "Give me three ideas for",
    "How would you improve",
    "Tell me about",
    "Why does",
    "Compare",
    "Rewrite this paragraph:",
    "Translate into English:",
    "Is it true that",
    "List the main points of",
)

_SYSTEM_PROMPTS: tuple[str, ...] = (
    "You are a helpful assistant.",
    "You are a helpful, respectful and honest assistant. Always answer as helpfully as possible.",
    "You are an AI assistant. You will be given a task. You must generate a detailed and long answer.",
    "You are a coding assistant. Answer with concise, working code.",
    "You are a math tutor. Explain each step and put the final answer in \\boxed{}.",
    "Du bist ein hilfreicher Assistent. Antworte bitte auf Deutsch.",
    "你是一个乐于助人的助手。请用中文回答。",
    "あなたは親切なアシスタントです。",
    "Ты — полезный ассистент. Отвечай по-русски.",
    "أنت مساعد مفيد.",
    "",  # an empty system prompt occurs in real data
)

_IDENTS: tuple[str, ...] = tuple(
    """
data value result items count total index name key node tree graph path
buffer offset size length width height user config cache queue stack token
tokens batch seq mask score weight bias grad loss step epoch rate text line
lines chunk parts row rows col cols left right mid start end first last acc
tmp out src dst obj record entry field options params args kwargs handler
callback response request client server parser reader writer stream
""".split()
)

_JS_WORDS: tuple[str, ...] = (
    "fetch",
    "render",
    "update",
    "handle",
    "parse",
    "format",
    "validate",
    "compute",
    "load",
    "save",
    "merge",
    "filter",
    "sort",
    "group",
    "build",
)

# ~300 frequent Han characters, weighted heavily against the whole
# CJK Unified Ideographs block so texts use thousands of distinct chars.
_HAN_COMMON = (
    "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得"
    "可你年生自会那后能对着事其里所去行过家十用发天如然作方成者多日都三小军二无"
    "同么经法当起与好看学进种将还分此心前面又定见只主没公从知理工开把现问题间明"
    "本高意实力电文长新通体点正部动产样性化还加数全机表量外做物重相平水最期应力"
    "气书门车路语言教育社会经济科技研究数据模型训练文本字符编码计算方法结果系统"
    "网络世界中国北京上海城市历史文化音乐电影朋友学生老师医院时间今天明天昨天早"
    "晚春夏秋冬山河海风雨雪花草树鸟鱼猫狗饭菜茶酒书报纸笔窗户桌椅床衣服鞋帽钱买"
    "卖商店银行工作休息旅游飞机火车汽车自行车快慢远近左右东南西北红黄蓝绿白黑"
)
_HAN_POOL: tuple[str, ...] = tuple(_HAN_COMMON) * 24 + tuple(chr(c) for c in range(0x4E00, 0x9FA6))
_ZH_PUNCT = ("，", "，", "，", "。", "。", "、", "；", "：", "！", "？")

_HIRAGANA: tuple[str, ...] = tuple(
    "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよ"
    "らりるれろわをんがぎぐげござじずぜぞだでどばびぶべぼぱぴぷぺぽ"
) + ("きょ", "しゃ", "ちょ", "にゅ", "っと", "ってい")
_JA_PARTICLES = ("は", "が", "を", "に", "で", "と", "の", "も", "から", "まで", "へ")
_JA_ENDINGS = ("です。", "ます。", "でした。", "ません。", "だ。", "でしょう。", "ですか？")
_KATAKANA_WORDS = (
    "コンピューター",
    "データ",
    "モデル",
    "プログラム",
    "ネットワーク",
    "テスト",
    "アルゴリズム",
    "ファイル",
    "サーバー",
    "ユーザー",
    "コーヒー",
    "ラーメン",
    "トークン",
    "パラメータ",
    "スマートフォン",
    "インターネット",
)

_KO_WORDS = (
    "안녕하세요",
    "감사합니다",
    "사람",
    "학교",
    "컴퓨터",
    "데이터",
    "모델",
    "한국어",
    "서울",
    "시간",
    "오늘",
    "내일",
    "공부",
    "문제",
    "방법",
    "결과",
    "생각",
    "이야기",
    "음식",
    "친구",
    "세계",
    "경제",
    "문화",
    "역사",
    "과학",
    "기술",
    "언어",
    "질문",
)
_KO_PARTICLES = ("은", "는", "이", "가", "을", "를", "에", "에서", "의", "와", "도", "로")
_KO_ENDINGS = ("합니다.", "입니다.", "했어요.", "있습니다.", "없어요.", "할까요?", "이다.")

_RU_WORDS = tuple(
    """
и в не на я быть он с что а по это она этот к но они мы как из у который то
за свой весь год от так о для ты же все тот мочь вы человек такой его сказать
только или ещё бы себя один как уже до время если сам когда другой вот говорить
наш мой знать стать при чтобы дело жизнь кто первый очень два день её новый рука
даже во со раз где там под можно ну какой после их работа без самый потом надо
хотеть ли слово идти большой должен место иметь ничто данные модель система язык
""".split()
)

_AR_WORDS = tuple(
    """
في من على إلى أن هذا هذه التي الذي كان قال مع عن ما لا هو هي كل بعد قبل
بين حتى عند إذا لكن أو ثم اللغة العربية البيانات النموذج الحاسوب الجامعة
الطالب المعلم الكتاب المدينة الشمس القمر الماء السماء العالم التاريخ العلم
""".split()
)
_AR_PUNCT = ("،", "،", ".", "؟", "؛")

_DE_WORDS = tuple(
    """
der die das und ist nicht ein eine zu mit für auf über unter groß klein schön
Straße Größe Mädchen Bäcker Brötchen Käse Frühstück Gemüse Übung Prüfung
Lösung Fähigkeit natürlich möglich schwierig fünf zwölf heißen müssen können
dürfen wählen Zürich München Köln Grüße Äpfel Öl Tür Müller Schlüssel
""".split()
)
_FR_WORDS = tuple(
    """
le la les et est un une des du de pour avec sur dans très été être où déjà
élève école église café théâtre hôpital forêt fenêtre garçon leçon français
naïve Noël cœur sœur œuvre à côté après première dernière année réponse
problème système modèle données façon façade ça crème brûlée pâte goût
""".split()
)

_HI_WORDS = (
    "नमस्ते",
    "भारत",
    "हिन्दी",
    "भाषा",
    "किताब",
    "पानी",
    "समय",
    "दुनिया",
    "विज्ञान",
    "कंप्यूटर",
    "धन्यवाद",
    "प्रश्न",
    "उत्तर",
    "है",
    "और",
    "में",
)
_TH_WORDS = ("สวัสดี", "ภาษาไทย", "ขอบคุณ", "คอมพิวเตอร์", "ข้อมูล", "โลก", "น้ำ", "เวลา")
_VI_WORDS = (
    "Tiếng",
    "Việt",
    "người",
    "được",
    "những",
    "trường",
    "học",
    "nước",
    "thế",
    "giới",
    "cảm",
    "ơn",
    "đường",
    "phố",
    "Hà",
    "Nội",
    "ở",
    "đây",
    "rồi",
)

_EMOJI: tuple[str, ...] = (
    "😀",
    "😂",
    "🤣",
    "😊",
    "😍",
    "🤔",
    "😎",
    "😭",
    "🙏",
    "👍",
    "👏",
    "🎉",
    "🚀",
    "🔥",
    "💯",
    "✨",
    "🌟",
    "🍕",
    "🍣",
    "☕",
    "🐍",
    "🦀",
    "🐧",
    "🌍",
    "📈",
    "💡",
    "✅",
    "❌",
    "⚠️",
    "❤️",
    "☀️",
    "✌️",
    "👍🏽",
    "👋🏻",
    "🙌🏿",
    "💪🏾",
    "👩‍💻",
    "👨‍👩‍👧‍👦",
    "🧑🏾‍🚀",
    "🏳️‍🌈",
    "🏳️‍⚧️",
    "❤️‍🔥",
    "🐻‍❄️",
    "👁️‍🗨️",
    "🇺🇸",
    "🇯🇵",
    "🇩🇪",
    "🇫🇷",
    "🇨🇳",
    "🇧🇷",
    "🏴󠁧󠁢󠁳󠁣󠁴󠁿",
    "1️⃣",
    "#️⃣",
    "🫠",
    "🫶",
    "🥲",
    "🪐",
)

_MATH_SYMBOLS = ("\\alpha", "\\beta", "\\gamma", "\\theta", "\\lambda", "\\mu", "\\sigma", "\\pi")
_MATH_VARS = ("x", "y", "z", "n", "k", "a", "b", "t")

_COMBINING = tuple(chr(c) for c in range(0x0300, 0x0370))
_HANGUL_SYLLABLES = tuple(chr(c) for c in range(0xAC00, 0xD7A4))

# --------------------------------------------------------------------------
# Unit makers. They draw fresh text and are fairly slow (~100-500 ns/char),
# so they are only used to build the per-kind pools below (and hard_strings).
# --------------------------------------------------------------------------


def _en_sentence(rng: random.Random) -> str:
    k = rng.randint(5, 18)
    ws = rng.choices(_EN_WORDS, k=k)
    if rng.random() < 0.15:
        ws.insert(0, rng.choice(_EN_CONNECTORS))
    else:
        ws[0] = ws[0].capitalize()
    if k > 9 and rng.random() < 0.4:
        j = rng.randrange(3, k - 3)
        ws[j] += ","
    return " ".join(ws) + rng.choice("......?!")


def _en_unit(rng: random.Random) -> str:
    """One or two English sentences."""
    if rng.random() < 0.5:
        return _en_sentence(rng) + " " + _en_sentence(rng)
    return _en_sentence(rng)


def _en_heading(rng: random.Random) -> str:
    return " ".join(rng.choices(_EN_WORDS, k=rng.randint(2, 5))).title()


def _py_expr(rng: random.Random) -> str:
    a, b = rng.sample(_IDENTS, 2)
    return rng.choice(
        (
            f"{a} + {b}",
            f"{a} * {rng.randint(2, 99)}",
            f"len({a})",
            f"[x * 2 for x in {a} if x > {rng.randint(0, 9)}]",
            f"{{k: v for k, v in {a}.items()}}",
            f"{a}.get({b!r}, None)",
            f'f"{{{a}}}: {{{b}:.3f}}"',
            f"sum({a}) / max(len({a}), 1)",
            f"{a}[{rng.randint(0, 5)}:{rng.randint(6, 20)}]",
            f"{rng.random() * 100:.4f}",
            f"{a} is not None and {b}",
            "'''multi\\nline'''",
        )
    )


def _py_block(rng: random.Random, depth: int, lines: list[str], budget: int) -> None:
    ind = "    " * depth
    for _ in range(rng.randint(1, budget)):
        r = rng.random()
        a, b = rng.sample(_IDENTS, 2)
        if r < 0.3:
            lines.append(f"{ind}{a} = {_py_expr(rng)}")
        elif r < 0.4:
            lines.append(f"{ind}# {_en_sentence(rng)}")
        elif r < 0.55 and depth < 4:
            lines.append(f"{ind}for {a} in {b}:")
            _py_block(rng, depth + 1, lines, max(1, budget - 2))
        elif r < 0.7 and depth < 4:
            lines.append(f"{ind}if {a} > {rng.randint(0, 1000)}:")
            _py_block(rng, depth + 1, lines, max(1, budget - 2))
            if rng.random() < 0.4:
                lines.append(f"{ind}else:")
                _py_block(rng, depth + 1, lines, 1)
        elif r < 0.78 and depth < 4:
            lines.append(f"{ind}try:")
            _py_block(rng, depth + 1, lines, 1)
            lines.append(f"{ind}except (KeyError, ValueError) as exc:")
            lines.append(f'{ind}    raise RuntimeError(f"bad {a}: {{exc}}") from exc')
        elif r < 0.86:
            lines.append(f"{ind}print({_py_expr(rng)})")
        elif r < 0.9:
            lines.append("")
        else:
            lines.append(f"{ind}{a}.append({_py_expr(rng)})")


def _py_code(rng: random.Random) -> str:
    lines: list[str] = []
    if rng.random() < 0.5:
        lines.append(rng.choice(("import os", "import json", "import numpy as np", "from typing import Any")))
        lines.append("")
    if rng.random() < 0.25:
        cname = "".join(w.capitalize() for w in rng.sample(_IDENTS, 2))
        lines.append(f"class {cname}:")
        lines.append(f'    """{_en_sentence(rng)}"""')
        lines.append("")
        lines.append(f"    def __init__(self, {rng.choice(_IDENTS)}):")
        _py_block(rng, 2, lines, 3)
        lines.append("")
        depth = 1
    else:
        depth = 0
    ind = "    " * depth
    fname = "_".join(rng.sample(_IDENTS, rng.randint(1, 3)))
    args = rng.sample(_IDENTS, rng.randint(0, 3))
    if depth:
        args.insert(0, "self")
    lines.append(f"{ind}def {fname}({', '.join(args)}):")
    if rng.random() < 0.6:
        lines.append(f'{ind}    """{_en_sentence(rng)}"""')
    _py_block(rng, depth + 1, lines, 5)
    lines.append(f"{ind}    return {_py_expr(rng)}")
    return "```python\n" + "\n".join(lines) + "\n```"


def _js_code(rng: random.Random) -> str:
    fname = rng.choice(_JS_WORDS) + rng.choice(_IDENTS).capitalize()
    a, b, c = rng.sample(_IDENTS, 3)
    lines = [f"function {fname}({a}, {b}) {{"]
    for _ in range(rng.randint(1, 5)):
        r = rng.random()
        if r < 0.3:
            lines.append(f"  const {c} = {a}.map((x) => x * {rng.randint(2, 9)});")
        elif r < 0.5:
            lines.append(f"  for (let i = 0; i < {a}.length; i++) {{")
            lines.append(f"    if ({a}[i] === {b}) {{")
            lines.append("      return i;")
            lines.append("    }")
            lines.append("  }")
        elif r < 0.65:
            lines.append(f"  console.log(`{c}: ${{{a}}} and ${{JSON.stringify({b})}}`);")
        elif r < 0.8:
            lines.append(f"  // {_en_sentence(rng)}")
        else:
            lines.append(f"  const {c} = {{ {a}: {rng.randint(0, 999)}, '{b}': null, nested: [1, 2, 3] }};")
    lines.append(f"  return {a} ?? {b};")
    lines.append("}")
    if rng.random() < 0.4:
        lines.append("")
        lines.append(f"export const {c}Async = async ({a}) => await {fname}({a}, {rng.randint(0, 9)});")
    return "```javascript\n" + "\n".join(lines) + "\n```"


def _other_code(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.35:
        a, b = rng.sample(_IDENTS, 2)
        lang = "bash"
        body = (
            f"for f in *.{a}; do\n  echo \"$f\" | grep -E '^{b}[0-9]+' >> out.txt\ndone\n"
            'export PATH="$HOME/.local/bin:$PATH"'
        )
    elif r < 0.65:
        obj = {k: rng.choice((rng.randint(0, 999), rng.random(), None, True, "x y")) for k in rng.sample(_IDENTS, 4)}
        lang, body = "json", json.dumps(obj, indent=2)
    elif r < 0.85:
        a, b = rng.sample(_IDENTS, 2)
        lang = "sql"
        body = (
            f"SELECT {a}, COUNT(*) AS n\nFROM {b}\nWHERE {a} IS NOT NULL\n"
            f"GROUP BY {a}\nORDER BY n DESC\nLIMIT {rng.randint(1, 100)};"
        )
    else:  # Makefile: tab indentation
        a = rng.choice(_IDENTS)
        lang, body = "makefile", f"{a}: {a}.o\n\t$(CC) -O2 -o $@ $^\n\n%.o: %.c\n\t$(CC) -c $< -o $@"
    return f"```{lang}\n{body}\n```"


def _number(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.25:
        return str(rng.randint(0, 100))
    if r < 0.4:
        return str(rng.randint(1000, 99_999_999))
    if r < 0.55:
        return f"{rng.uniform(-1000, 1000):.{rng.randint(1, 6)}f}"
    if r < 0.65:
        return rng.choice(("3.14159", "2.71828", "1.41421", "0.5772", "6.022e23", "1e-9", "12345678"))
    if r < 0.75:
        return f"{rng.randint(1000, 9_999_999):,}"
    if r < 0.85:
        return f"{rng.randint(1, 99)}%"
    return f"{rng.randint(1, 9)}/{rng.randint(2, 12)}"


def _latex(rng: random.Random) -> str:
    v = rng.choice(_MATH_VARS)
    s = rng.choice(_MATH_SYMBOLS)
    a, b = rng.randint(1, 99), rng.randint(2, 99)
    n = rng.randint(2, 50)
    r = rng.randrange(9)
    if r == 0:
        return f"$\\frac{{{a}}}{{{b}}} \\approx {a / b:.5f}$"
    if r == 1:
        return f"$$\\sum_{{i=1}}^{{{n}}} i = \\frac{{{n}({n}+1)}}{{2}} = {n * (n + 1) // 2}$$"
    if r == 2:
        return f"$\\int_0^{{{n}}} {v}^{{{a % 5 + 1}}}\\,d{v} = \\frac{{{n}^{{{a % 5 + 2}}}}}{{{a % 5 + 2}}}$"
    if r == 3:
        return f"$\\sqrt{{{a}}} \\approx {math.sqrt(a):.6f}$"
    if r == 4:
        return f"$$\\begin{{pmatrix}} {a} & {b} \\\\ {n} & {a - b} \\end{{pmatrix}}$$"
    if r == 5:
        return f"${s}^2 + {v}^2 = {a}$ and ${s} \\in \\mathbb{{R}}$"
    if r == 6:
        return f"$$\\begin{{aligned}} {v} &= {a} + {b} \\\\ &= {a + b} \\end{{aligned}}$$"
    if r == 7:
        return f"$\\lim_{{{v} \\to \\infty}} \\left(1 + \\frac{{1}}{{{v}}}\\right)^{{{v}}} = e$"
    return f"$P({v} \\le {a}) = {rng.random():.4f}$"


def _math_line(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.35:
        return _en_sentence(rng)[:-1] + f", using {_latex(rng)}."
    if r < 0.65:
        return _latex(rng)
    if r < 0.9:
        ws = rng.choices(_EN_WORDS, k=rng.randint(6, 14))
        ws[0] = ws[0].capitalize()
        return " ".join(_number(rng) if rng.random() < 0.3 else w for w in ws) + "."
    return f"{_number(rng)} + {_number(rng)} = ?"


_HAN_STREAM: list[str] = []  # one long random Han string, built on first use
_HANGUL_STREAM: list[str] = []  # one long string of random Hangul syllables


def _stream(cache: list[str], name: str, alphabet: Sequence[str], size: int) -> str:
    if not cache:
        cache.append("".join(random.Random(f"stream:{name}").choices(alphabet, k=size)))
    return cache[0]


def _zh_unit(rng: random.Random) -> str:
    """1-3 Chinese clauses (random Han text, frequent chars weighted up)."""
    han = _stream(_HAN_STREAM, "han", _HAN_POOL, 120_000)
    out: list[str] = []
    for _ in range(rng.randint(1, 3)):
        k = rng.randint(4, 22)
        o = rng.randrange(len(han) - k)
        out.append(han[o : o + k])
        r = rng.random()
        if r < 0.05:
            out.append(_number(rng))
        elif r < 0.08:
            out.append(" " + rng.choice(_EN_WORDS) + " ")
        out.append(rng.choice(_ZH_PUNCT))
    return "".join(out)


def _ja_sentence(rng: random.Random) -> str:
    out: list[str] = []
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        if r < 0.4:
            out.append("".join(rng.choices(_HAN_COMMON, k=rng.randint(1, 3))))
        elif r < 0.6:
            out.append(rng.choice(_KATAKANA_WORDS))
        else:
            out.append("".join(rng.choices(_HIRAGANA, k=rng.randint(2, 5))))
        out.append(rng.choice(_JA_PARTICLES))
        if rng.random() < 0.25:
            out.append("、")
    out.append(rng.choice(_JA_ENDINGS))
    return "".join(out)


def _ko_sentence(rng: random.Random) -> str:
    words = []
    for _ in range(rng.randint(2, 7)):
        if rng.random() < 0.5:
            w = rng.choice(_KO_WORDS)
        else:
            hangul = _stream(_HANGUL_STREAM, "hangul", _HANGUL_SYLLABLES, 50_000)
            k = rng.randint(1, 4)
            o = rng.randrange(len(hangul) - k)
            w = hangul[o : o + k]
        words.append(w + (rng.choice(_KO_PARTICLES) if rng.random() < 0.6 else ""))
    return " ".join(words) + " " + rng.choice(_KO_ENDINGS)


def _word_sentence(words: Sequence[str], punct: Sequence[str]) -> Callable[[random.Random], str]:
    def make(rng: random.Random) -> str:
        ws = rng.choices(words, k=rng.randint(4, 14))
        ws[0] = ws[0][:1].upper() + ws[0][1:]
        return " ".join(ws) + rng.choice(punct)

    return make


_ru_plain = _word_sentence(_RU_WORDS, (".", ".", ".", "?", "!", "…"))


def _ru_sentence(rng: random.Random) -> str:
    s = _ru_plain(rng)
    if rng.random() < 0.05:
        s += " «Ёлка», — сказал он. Цена: " + _number(rng) + " ₽."
    return s


def _emoji_sentence(rng: random.Random) -> str:
    out: list[str] = []
    for w in rng.choices(_EN_WORDS, k=rng.randint(4, 14)):
        out.append(w)
        if rng.random() < 0.2:
            out.append(rng.choice(_EMOJI))
    if rng.random() < 0.2:
        out.append("".join(rng.choices(_EMOJI, k=rng.randint(2, 8))))
    out[0] = out[0].capitalize()
    return " ".join(out) + rng.choice((".", "!", "!!", " 🎉"))


def _combining_chunk(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.35:  # "zalgo": random combining marks on Latin letters
        return "".join(
            ch + "".join(rng.choices(_COMBINING, k=rng.randint(1, 4))) if rng.random() < 0.5 else ch
            for ch in " ".join(rng.choices(_EN_WORDS, k=rng.randint(1, 4)))
        )
    if r < 0.55:
        return " ".join(rng.choices(_VI_WORDS, k=rng.randint(2, 8))) + "."
    if r < 0.7:
        return " ".join(rng.choices(_HI_WORDS, k=rng.randint(2, 8))) + "।"
    if r < 0.8:
        return "".join(rng.choices(_TH_WORDS, k=rng.randint(2, 5)))
    if r < 0.9:  # NFD forms: base letter + combining accent
        return " ".join(
            rng.choices(("cafe\u0301", "nai\u0308ve", "Zu\u0308rich", "n\u0303", "A\u030a", "e\u0301le\u0300ve"), k=3)
        )
    return _en_sentence(rng)


# --------------------------------------------------------------------------
# Pools. Messages are assembled from pools of pre-generated units (sentences,
# clauses, code blocks, math lines): the per-message cost is then a handful
# of rng calls and joins instead of one rng call per word or character.
# Pools are built lazily, once per process, from fixed seeds, so they do not
# depend on the caller's seed and never change between runs.
# --------------------------------------------------------------------------


def _multi(maker: Callable[[random.Random], str], sep: str, lo: int, hi: int) -> Callable[[random.Random], str]:
    """Unit maker joining ``lo..hi`` units of ``maker`` with ``sep``."""

    def make(rng: random.Random) -> str:
        return sep.join([maker(rng) for _ in range(rng.randint(lo, hi))])

    return make


_POOL_MAKERS: dict[str, tuple[Callable[[random.Random], str], int]] = {
    "en": (_en_unit, 8_000),
    "heading": (_en_heading, 500),
    "py": (_py_code, 600),
    "js": (_js_code, 800),
    "other_code": (_other_code, 300),
    "math": (_math_line, 5_000),
    "zh": (_multi(_zh_unit, "", 1, 3), 3_000),
    "ja": (_multi(_ja_sentence, "", 2, 6), 2_000),
    "ko": (_multi(_ko_sentence, " ", 1, 4), 2_000),
    "ru": (_multi(_ru_sentence, " ", 1, 3), 3_000),
    "ar": (_multi(_word_sentence(_AR_WORDS, _AR_PUNCT), " ", 1, 3), 2_500),
    "de": (_multi(_word_sentence(_DE_WORDS, (".", ".", "?", "!")), " ", 1, 3), 2_500),
    "fr": (_multi(_word_sentence(_FR_WORDS, (".", ".", " ?", " !", " :")), " ", 1, 3), 2_500),
    "emoji": (_multi(_emoji_sentence, " ", 1, 2), 2_500),
    "comb": (_multi(_combining_chunk, " ", 1, 4), 2_000),
}
_POOLS: dict[str, tuple[tuple[str, ...], float]] = {}


def _pool(name: str) -> tuple[tuple[str, ...], float]:
    """Return (units, mean unit length) of pool ``name``, building it once."""
    got = _POOLS.get(name)
    if got is None:
        maker, size = _POOL_MAKERS[name]
        rng = random.Random(f"pool:{name}")
        units = tuple(maker(rng) for _ in range(size))
        got = _POOLS[name] = (units, sum(map(len, units)) / size)
    return got


def _paragraphs(rng: random.Random, name: str, target: int, sep: str = " ", lo: int = 1, hi: int = 4) -> str:
    """Join pool units into paragraphs (``sep`` inside, blank line between)
    until at least ``target`` characters (at least one unit)."""
    units, avg = _pool(name)
    n = len(units)
    rnd = rng.random
    span = hi - lo + 1
    out: list[str] = []
    size = 0
    while size < target:
        k = min(lo + int(rnd() * span), int((target - size) / avg) + 1)
        para = sep.join([units[int(rnd() * n)] for _ in range(k)])
        out.append(para)
        size += len(para) + 2
    return "\n\n".join(out)


def _gen_prose(rng: random.Random, target: int) -> str:
    units, avg = _pool("en")
    n = len(units)
    rnd = rng.random
    parts: list[str] = []
    size = 0
    while size < target:
        r = rnd()
        if r < 0.06 and parts:
            p = "## " + rng.choice(_pool("heading")[0])
        elif r < 0.16:
            items = [units[int(rnd() * n)] for _ in range(2 + int(rnd() * 5))]
            if r < 0.11:
                p = "\n".join(f"{j + 1}. {s}" for j, s in enumerate(items))
            else:
                p = "\n".join("- " + s for s in items)
        elif r < 0.19:
            p = "> " + units[int(rnd() * n)]
        else:
            k = min(2 + int(rnd() * 6), int((target - size) / avg) + 1)
            p = " ".join([units[int(rnd() * n)] for _ in range(k)])
        parts.append(p)
        size += len(p) + 2
    return "\n\n".join(parts)


def _gen_code(rng: random.Random, target: int) -> str:
    parts: list[str] = []
    size = 0
    while size < target:
        r = rng.random()
        if r < 0.3:
            p = " ".join(rng.choices(_pool("en")[0], k=rng.randint(1, 3)))
        elif r < 0.7:
            p = rng.choice(_pool("py")[0])
        elif r < 0.87:
            p = rng.choice(_pool("js")[0])
        else:
            p = rng.choice(_pool("other_code")[0])
        parts.append(p)
        size += len(p) + 2
    return "\n\n".join(parts)


def _gen_math(rng: random.Random, target: int) -> str:
    units, _ = _pool("math")
    parts: list[str] = []
    size = 0
    step = 1
    while size < target:
        p = rng.choice(units)
        if rng.random() < 0.3:
            p = f"Step {step}: {p}"
            step += 1
        parts.append(p)
        size += len(p) + 1
    parts.append(f"Therefore, the answer is $\\boxed{{{_number(rng)}}}$.")
    return ("\n\n" if rng.random() < 0.5 else "\n").join(parts)


def _gen_chinese(rng: random.Random, target: int) -> str:
    return _paragraphs(rng, "zh", target, sep="")


def _gen_japanese(rng: random.Random, target: int) -> str:
    return _paragraphs(rng, "ja", target, sep="")


def _gen_korean(rng: random.Random, target: int) -> str:
    return _paragraphs(rng, "ko", target)


def _gen_russian(rng: random.Random, target: int) -> str:
    return _paragraphs(rng, "ru", target)


def _gen_arabic(rng: random.Random, target: int) -> str:
    return _paragraphs(rng, "ar", target)


def _gen_european(rng: random.Random, target: int) -> str:
    return _paragraphs(rng, "de" if rng.random() < 0.5 else "fr", target)


def _gen_emoji(rng: random.Random, target: int) -> str:
    return _paragraphs(rng, "emoji", target)


def _gen_combining(rng: random.Random, target: int) -> str:
    return _paragraphs(rng, "comb", target)


_GENERATORS: dict[str, Callable[[random.Random, int], str]] = {
    "prose": _gen_prose,
    "code": _gen_code,
    "math": _gen_math,
    "chinese": _gen_chinese,
    "japanese": _gen_japanese,
    "korean": _gen_korean,
    "russian": _gen_russian,
    "arabic": _gen_arabic,
    "european": _gen_european,
    "emoji": _gen_emoji,
    "combining": _gen_combining,
}
_SINGLE_KINDS = tuple(_GENERATORS)


def _gen_multilingual(rng: random.Random, target: int) -> str:
    parts: list[str] = []
    size = 0
    while size < target:
        p = _GENERATORS[rng.choice(_SINGLE_KINDS)](rng, rng.randint(40, 400))
        parts.append(p)
        size += len(p) + 1
    return rng.choice(("\n\n", "\n", " ")).join(parts)


_GENERATORS["multilingual"] = _gen_multilingual

#: Content kinds and their relative weights; ``source`` is ``f"synthetic/{kind}"``.
KINDS: dict[str, int] = {
    "prose": 30,
    "code": 15,
    "math": 10,
    "chinese": 8,
    "japanese": 4,
    "korean": 3,
    "russian": 4,
    "arabic": 3,
    "european": 5,
    "emoji": 4,
    "combining": 2,
    "multilingual": 8,
}
_KIND_NAMES = tuple(KINDS)
_KIND_CUM = list(itertools.accumulate(KINDS.values()))
# Number of user turns 1..12: mostly single-turn, with a tail (mean ~1.9).
_TURN_CUM = list(itertools.accumulate((64, 12, 7, 5, 3, 2.5, 1.5, 1.2, 1, 0.8, 0.5, 0.5)))

# Probabilities of the rarer features (per conversation unless noted).
_P_SYSTEM = 0.15
_P_ENDS_WITH_USER = 0.03
_P_EMPTY_ASSISTANT = 0.01  # per assistant message
_P_LONG = 0.004  # one assistant content of 20k-60k chars
_P_CRLF = 0.02  # per message: "\n" -> "\r\n"
_P_PADDED = 0.03  # per message: leading/trailing whitespace

_CODE_ASKS = (
    "Write a Python function for this:",
    "Fix the bug in this code:",
    "Convert this to JavaScript:",
    "What does this code do?",
    "Add type hints:",
    "Write unit tests for the following.",
    "Optimize this snippet:",
)
_MATH_ASKS = ("Solve:", "Compute", "Prove that", "Simplify", "Evaluate", "Find x if")


def _pick_kind(rng: random.Random) -> str:
    return rng.choices(_KIND_NAMES, cum_weights=_KIND_CUM)[0]


def _length(rng: random.Random, mu: float, sigma: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, int(math.exp(mu + sigma * rng.gauss(0.0, 1.0)))))


def _user_content(rng: random.Random, kind: str) -> str:
    target = _length(rng, 4.6, 1.0, 8, 4000)  # ~100; whole units -> median ~200 chars
    r = rng.random()
    if kind == "code" and r < 0.7:
        ask = rng.choice(_CODE_ASKS)
        if r < 0.35:
            return ask + "\n\n" + _gen_code(rng, 1)
        return ask + " " + rng.choice(_pool("en")[0])
    if kind == "math" and r < 0.6:
        return f"{rng.choice(_MATH_ASKS)} {_latex(rng)}"
    if kind in ("prose", "emoji") and r < 0.6:
        return rng.choice(_USER_OPENERS) + " " + _GENERATORS[kind](rng, target)
    return _GENERATORS[kind](rng, target)


def _assistant_content(rng: random.Random, kind: str) -> str:
    target = _length(rng, 6.2, 0.9, 20, 12_000)  # ~500; whole units -> median ~600 chars
    return _GENERATORS[kind](rng, target)


def _postprocess(rng: random.Random, text: str) -> str:
    r = rng.random()
    if r < _P_CRLF:
        return text.replace("\n", "\r\n")
    if r < _P_CRLF + _P_PADDED:
        return rng.choice((" ", "\n", "  \n", "\t", "\u00a0")) + text + rng.choice((" ", "\n", "\n\n", "  "))
    return text


def conversation(seed: int, i: int) -> dict[str, Any]:
    """Return row ``i`` of ``conversations(n, seed)`` for any ``n > i``.

    The row depends only on ``(seed, i)``: it is drawn from
    ``random.Random(f"{seed}:{i}")``.
    """
    rng = random.Random(f"{seed}:{i}")
    kind = _pick_kind(rng)
    turns = rng.choices(range(1, 13), cum_weights=_TURN_CUM)[0]
    messages: list[dict[str, str]] = []
    if rng.random() < _P_SYSTEM:
        if rng.random() < 0.8:
            sys_prompt = rng.choice(_SYSTEM_PROMPTS)
        else:
            sys_prompt = _SYSTEM_PROMPTS[0] + " " + _gen_prose(rng, rng.randint(100, 1500))
        messages.append({"role": "system", "content": sys_prompt})
    long_turn = rng.randrange(turns) if rng.random() < _P_LONG else -1
    ends_with_user = rng.random() < _P_ENDS_WITH_USER
    for t in range(turns):
        ukind = kind if rng.random() < 0.85 else _pick_kind(rng)
        messages.append({"role": "user", "content": _postprocess(rng, _user_content(rng, ukind))})
        if t == turns - 1 and ends_with_user:
            break
        akind = kind if rng.random() < 0.8 else _pick_kind(rng)
        if t == long_turn:
            content = _GENERATORS[akind](rng, rng.randint(20_000, 60_000))
        elif rng.random() < _P_EMPTY_ASSISTANT:
            content = ""
        else:
            content = _postprocess(rng, _assistant_content(rng, akind))
        messages.append({"role": "assistant", "content": content})
    return {"id": f"synthetic_{i}", "messages": messages, "source": f"synthetic/{kind}"}


def conversations(n: int, seed: int = 0, adversarial: bool = False) -> list[dict[str, Any]]:
    """Return ``n`` synthetic Tulu-3-SFT-style rows ``{id, messages, source}``.

    * Deterministic: the same ``(n, seed, adversarial)`` gives identical output.
    * Prefix-stable: ``conversations(n, seed)`` equals
      ``conversations(n + k, seed)[:n]`` (each row depends only on
      ``(seed, i)``; see :func:`conversation`).
    * ``adversarial=True`` takes the same rows and, using a separate per-row
      stream ``random.Random(f"{seed}:{i}:adv")``, splices tokenizer-hostile
      fragments (special-token strings, half tokens, odd whitespace, ZWJ,
      astral characters, occasionally a 30,000+ char run) into about a third
      of the rows. Ids, sources, roles and structure are unchanged. It is
      prefix-stable too.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rows = [conversation(seed, i) for i in range(n)]
    if adversarial:
        for i, row in enumerate(rows):
            _make_adversarial(row, random.Random(f"{seed}:{i}:adv"))
    return rows


# --------------------------------------------------------------------------
# Adversarial strings
# --------------------------------------------------------------------------

_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|im_start|>",
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<|endoftext|>",
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|reserved_token_163700|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_250|>",
    "[EOS]",
    "[BOS]",
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "<s>",
    "</s>",
    "<unk>",
    "<pad>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
)

_HALF_TOKENS: tuple[str, ...] = (
    "<|im_",
    "im_end|>",
    "<|im_end",
    "|im_end|>",
    "<|",
    "|>",
    "<|reserved_token_",
    "<think",
    "</thin",
    "think>",
    "[EO",
    "S]",
    "</",
    "<|<|im_end|>|>",
    "<<|im_end|>>",
    "<|im_end|><|im_start|>assistant\n",
    "<|im_start|>user\n",
    "</s><s>",
)

_ODD_WS: tuple[str, ...] = (
    "\r\n",
    "\r",
    "\n\r",
    "\t",
    "\v",
    "\f",
    "\u00a0",
    "\u3000",
    "\u2028",
    "\u2029",
    "\u0085",
    "\u200b",
    "\u200c",
    "\u200d",
    "\u2060",
    "\ufeff",
    "\u202f",
    "\u2009",
    "\u1680",
    "\u180e",
    " \t \t",
    "\r\n\r\n",
    "\n\n\n\n",
)

_ASTRAL: tuple[str, ...] = (
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "𝐀𝐁𝐂",
    "𠀀𠀁𠀂",
    "𪚥",
    "𐍈",
    "🀄",
    "𓀀𓁐",
    "\U000f0000",
    "\U0010fffd",
    "🏴󠁧󠁢󠁳󠁣󠁴󠁿",
    "👨‍👩‍👧‍👦",
    "🧑🏾‍🚀",
    "\U0001f600\u200d",
    "\u200d\u200d\u200d",
)

_MISC_HARD: tuple[str, ...] = (
    "",
    " ",
    "  ",
    "\n",
    "a",
    "\x00",
    "a\x00b",
    "\ufffd",
    "\uffff",
    "\ue000",
    "\u202eevil\u202c",
    "\u061c",
    "e" + "\u0301" * 50,
    "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇",
    "ﬁ ﬂ ﬃ",
    "Ⅻ ① ½ ²",
    "ｆｕｌｌｗｉｄｔｈ",
    "İı ǅ ß ẞ",
    "'\"`\\",
    "\\n literal backslash-n",
    "{{ bos_token }}{% for m in messages %}",
    "```",
    "```python\n",
    "\u0000\u0001\u001f\u007f",
)


def _pieces(rng: random.Random, k: int) -> list[str]:
    pools = (_SPECIAL_TOKENS, _HALF_TOKENS, _ODD_WS, _ASTRAL, _MISC_HARD, _EMOJI, _EN_WORDS)
    return [rng.choice(rng.choice(pools)) for _ in range(k)]


def hard_strings(seed: int = 0) -> list[str]:
    """Return strings that stress a tokenizer / chat template, deterministically.

    Contents (same ``seed`` -> same list; different seeds vary the random
    mixtures and long-text fillers, the fixed entries are always present):

    * every special-token string in the catalogue (``"<|im_end|>"``,
      ``"<|im_user|>"``, ``"[EOS]"``, ``"<think>"``, ``"</think>"``,
      ``"<|reserved_token_163700|>"``, ...), alone and glued to text;
    * half / broken / nested special tokens (``"<|im_"``, ``"im_end|>"``, ...);
    * odd whitespace: ``"\\r\\n"`` mixes, tabs, ``"\\u00a0"``, ``"\\u3000"``,
      zero-width (non-)joiners, BOM, line/paragraph separators;
    * astral-plane characters, emoji ZWJ sequences, combining-mark stacks;
    * a few long strings: a run of 30,000+ spaces, a run of 30,000+
      non-space characters, runs of newlines / tabs / one CJK char, and one
      text longer than 400,000 characters;
    * ~40 random mixtures of the above.

    All strings are valid Unicode (no lone surrogates). Total size is about
    0.7 M characters, so building it is cheap.
    """
    rng = random.Random(f"hard:{seed}")
    out: list[str] = []
    out.extend(_SPECIAL_TOKENS)
    out.extend(_HALF_TOKENS)
    out.extend(_ODD_WS)
    out.extend(_ASTRAL)
    out.extend(_MISC_HARD)
    # Special tokens embedded in ordinary text and in a chat-like frame.
    for tok in _SPECIAL_TOKENS:
        out.append(f"Hello{tok}world {tok} {_en_sentence(rng)}")
    out.append("".join(_SPECIAL_TOKENS))
    out.append("<|im_start|>system\nIgnore this.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n")
    out.append("<think>\nreasoning\n</think>\n\nanswer")
    out.append("line1\r\nline2\nline3\rline4\r\n\r\nline6\n\r")
    out.append("\tdef f():\n\t\treturn 1\n    \tmixed\t    indent\n")
    out.append("a\u00a0b\u3000c\u200bd\u200de\u200cf\u2060g\ufeffh")
    # Long runs (the only expensive entries; a handful).
    out.append(" " * 30_001)
    out.append("x" * 30_000)
    out.append("".join(rng.choices("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+/=_-", k=40_000)))
    out.append("word" + " " * 35_000 + "word")
    out.append("\n" * 30_000)
    out.append("\t" * 30_000)
    out.append("的" * 30_000)
    out.append("😀" * 10_000)
    out.append("<|im_end|>" * 3_000)
    out.append("\r\n" * 15_000)
    out.append("1234567890" * 3_100)
    # > 400,000 chars of mixed realistic text.
    chunks: list[str] = []
    size = 0
    kinds = tuple(_GENERATORS)
    while size <= 400_000:
        c = _GENERATORS[kinds[len(chunks) % len(kinds)]](rng, 20_000)
        chunks.append(c)
        size += len(c) + 2
    out.append("\n\n".join(chunks))
    # Random mixtures.
    for _ in range(40):
        out.append(rng.choice(("", " ", "\n")).join(_pieces(rng, rng.randint(2, 30))))
    return out


def _make_adversarial(row: dict[str, Any], rng: random.Random) -> None:
    if rng.random() >= 0.35:
        return
    msgs = row["messages"]
    for _ in range(rng.randint(1, 3)):
        m = msgs[rng.randrange(len(msgs))]
        r = rng.random()
        if r < 0.01:
            frag = rng.choice((" ", "x", "\n", "的")) * rng.randint(30_000, 40_000)
        else:
            frag = "".join(_pieces(rng, rng.randint(1, 8)))
        text = m["content"]
        pos = rng.randint(0, len(text))
        m["content"] = text[:pos] + frag + text[pos:]


def hard_conversations(seed: int = 0) -> list[dict[str, Any]]:
    """Rows built from :func:`hard_strings`: string ``j`` is the assistant
    content of row ``2j`` and the user content of row ``2j + 1``.

    Ids are ``f"synthetic_hard_{k}"``, source ``"synthetic/hard"``. Roles follow
    the same rules as :func:`conversations`.
    """
    rows: list[dict[str, Any]] = []
    for j, s in enumerate(hard_strings(seed)):
        rows.append(
            {
                "id": f"synthetic_hard_{2 * j}",
                "messages": [
                    {"role": "user", "content": "Repeat exactly:"},
                    {"role": "assistant", "content": s},
                ],
                "source": "synthetic/hard",
            }
        )
        rows.append(
            {
                "id": f"synthetic_hard_{2 * j + 1}",
                "messages": [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": s},
                    {"role": "assistant", "content": "OK."},
                ],
                "source": "synthetic/hard",
            }
        )
    return rows


# --------------------------------------------------------------------------
# Writers
# --------------------------------------------------------------------------

#: Arrow type of ``messages`` as in the HF ``allenai/tulu-3-sft-mixture`` files.
MESSAGE_TYPE = pa.list_(pa.struct([pa.field("content", pa.string()), pa.field("role", pa.string())]))
#: Arrow schema of a Tulu 3 SFT Parquet file.
TULU_SCHEMA = pa.schema(
    [pa.field("id", pa.string()), pa.field("messages", MESSAGE_TYPE), pa.field("source", pa.string())]
)


def _to_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    ids = [r["id"] for r in rows]
    messages = [[{"content": m["content"], "role": m["role"]} for m in r["messages"]] for r in rows]
    sources = [r["source"] for r in rows]
    return pa.Table.from_arrays(
        [pa.array(ids, pa.string()), pa.array(messages, MESSAGE_TYPE), pa.array(sources, pa.string())],
        schema=TULU_SCHEMA,
    )


def write_parquet(
    rows: Sequence[dict[str, Any]],
    path: str | os.PathLike[str],
    rows_per_file: int | None = None,
) -> list[Path]:
    """Write ``rows`` as Tulu-schema Parquet and return the written paths.

    Schema: ``id: string``, ``messages: list<struct<content: string, role:
    string>>`` (``content`` first, like the HF dataset), ``source: string``.

    * ``rows_per_file is None``: one file at ``path`` (parent folders created).
    * otherwise ``path`` is a folder (created) receiving
      ``train-{k:05d}-of-{N:05d}.parquet`` for ``k < N = ceil(len(rows) /
      rows_per_file)`` (at least one file, possibly empty), each holding
      consecutive rows; reading them in name order restores ``rows``.
    """
    path = Path(path)
    if rows_per_file is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(_to_table(rows), path)
        return [path]
    if rows_per_file <= 0:
        raise ValueError(f"rows_per_file must be positive, got {rows_per_file}")
    path.mkdir(parents=True, exist_ok=True)
    nfiles = max(1, -(-len(rows) // rows_per_file))
    written: list[Path] = []
    for k in range(nfiles):
        p = path / f"train-{k:05d}-of-{nfiles:05d}.parquet"
        pq.write_table(_to_table(rows[k * rows_per_file : (k + 1) * rows_per_file]), p)
        written.append(p)
    return written


# Characters json.dumps(ensure_ascii=False) leaves raw that str.splitlines()
# would treat as line breaks; escaping them keeps "one row per line" robust.
_JSONL_ESCAPES = (("\u2028", "\\u2028"), ("\u2029", "\\u2029"), ("\u0085", "\\u0085"))


def write_jsonl(rows: Iterable[dict[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Write ``rows`` as UTF-8 JSON Lines (one object per ``"\\n"``-terminated
    line, keys ``id``, ``messages``, ``source``) and return the path.

    Non-ASCII is written raw, except U+0085, U+2028 and U+2029, which are
    escaped so that no reader splits a row across lines.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            obj = {"id": r["id"], "messages": r["messages"], "source": r["source"]}
            line = json.dumps(obj, ensure_ascii=False)
            for raw, escaped in _JSONL_ESCAPES:
                if raw in line:
                    line = line.replace(raw, escaped)
            f.write(line)
            f.write("\n")
    return path


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a file written by :func:`write_jsonl` back into rows."""
    with open(path, encoding="utf-8", newline="\n") as f:
        return [json.loads(line) for line in f if line.strip("\n")]
