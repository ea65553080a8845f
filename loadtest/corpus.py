"""What the accuracy A/B sends: text passages for teacher-forced KL, and word problems with exact answers.

Both built-in sets are generated from a seed by the code below (no download, nothing to license):
passage i and problem i are pure functions of (seed, i), so every server and every later run sees
the same texts. User files replace them:
    --corpus FILE    plain UTF-8 text, passages separated by blank lines; or JSONL with a "text" field
    --dataset FILE   JSONL with "question" and "answer" (GSM8K style: the number after "####" in the
                     answer, else the answer itself must be a number)
The sha256 of each set (over its texts, in order) is stored with the results: two runs compare only
when it matches.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PASSAGES = 200
DEFAULT_PROBLEMS = 300
MAX_PASSAGE_CHARS = 20000  # a user passage longer than this is an error: it would be scored as one huge prompt

_NAMES = (
    "Ana Ben Chloe Dmitri Elena Farid Grace Hiro Ines Jonas Kofi Lena Mateo Nadia Omar Priya Quinn Rosa Sven Tariq "
    "Uma Victor Wen Yara"
).split()
_PLACES = ("market", "library", "harbor", "train station", "bakery", "museum", "park", "hardware store",
           "school", "clinic", "post office", "river bank")  # fmt: skip
_ITEMS = ("apples", "pencils", "stamps", "marbles", "books", "candles", "tickets", "oranges", "bolts",
          "cards", "bottles", "plates")  # fmt: skip
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_WEATHER = ("cold and bright", "grey and windy", "warm but cloudy", "wet from the night's rain", "quiet and foggy")
_FEELINGS = ("pleased", "tired", "curious", "relieved", "surprised", "calm")
_TASKS = (
    ("bake a loaf of bread", ("mix the flour, water, salt and yeast", "knead the dough for ten minutes",
     "let it rise until it doubles", "shape the loaf", "bake it in a hot oven until the crust is brown")),
    ("replace a bicycle tire", ("release the brake", "open the quick release and take the wheel out",
     "lever the old tire off the rim", "fit the new tube and tire", "pump it to the pressure on the sidewall")),
    ("plant a tree", ("dig a hole twice as wide as the root ball", "loosen the roots", "set the tree upright",
     "fill the hole with soil", "water it deeply once a week")),
    ("back up a computer", ("plug in an external drive", "choose the folders to copy", "start the backup",
     "check that the files open", "store the drive somewhere safe")),
    ("make a cup of tea", ("boil fresh water", "warm the pot", "add one spoon of leaves per cup",
     "pour the water and wait four minutes", "strain the tea into the cups")),
)  # fmt: skip
_TOPICS = (
    ("A graphics processor", "runs thousands of small threads at once", "memory bandwidth",
     "most of its time is spent waiting for data rather than computing"),
    ("A database index", "keeps keys in sorted order", "the number of disk reads",
     "a query can skip most of the table"),
    ("A compiler", "turns source code into machine instructions", "the quality of register allocation",
     "the same program can run several times faster"),
    ("A network switch", "forwards packets between ports", "the size of its buffers",
     "short bursts of traffic do not get dropped"),
    ("A battery", "stores energy in chemical form", "the temperature of its cells",
     "it lasts longer when it is kept cool"),
    ("A cache", "keeps recently used data close to the processor", "the hit rate",
     "a small fast memory can hide a large slow one"),
)  # fmt: skip
_FUNCS = (("total", "+"), ("difference", "-"), ("product", "*"), ("largest", "max"), ("smallest", "min"))


def _narrative(rng: random.Random) -> str:
    a, b = rng.sample(_NAMES, 2)
    place, item, day = rng.choice(_PLACES), rng.choice(_ITEMS), rng.choice(_DAYS)
    n, m = rng.randint(2, 40), rng.randint(2, 9)
    weather, feeling = rng.choice(_WEATHER), rng.choice(_FEELINGS)
    return (
        f"On {day} morning the weather was {weather}. {a} walked to the {place} to buy {n} {item}, "
        f"as {b} had asked the day before. The {place} was busier than usual, and {a} had to wait for almost "
        f"{m * 5} minutes. While waiting, {a} talked with an old neighbour about the new bridge over the river "
        f"and about the price of {item}, which had gone up again. When {a} finally got home, {b} was {feeling} "
        f"to see the {item} and said that {n} would be enough for the whole week. In the evening they sat in the "
        f"kitchen, made plans for {rng.choice(_DAYS)}, and decided to visit the {rng.choice(_PLACES)} together."
    )


def _howto(rng: random.Random) -> str:
    task, steps = rng.choice(_TASKS)
    name = rng.choice(_NAMES)
    text = f"How to {task}. This guide was written by {name}. You will need about {rng.randint(10, 90)} minutes. "
    text += "First, " + steps[0] + ". "
    for word, step in zip(("Next", "Then", "After that", "Finally"), steps[1:], strict=False):
        text += f"{word}, {step}. "
    text += (
        f"If something goes wrong, stop and start again from step {rng.randint(1, len(steps))}; it is usually faster "
    )
    text += "than trying to fix a mistake halfway through. Most people find it easier the second time."
    return text


def _explainer(rng: random.Random) -> str:
    thing, does, limit, result = rng.choice(_TOPICS)
    pct = rng.randint(10, 90)
    return (
        f"{thing} {does}. Its speed is often limited by {limit}, not by how fast its parts can work on their own. "
        f"Engineers measure this by running a simple test many times and recording how long each run takes. "
        f"In one such test, improving {limit} by {pct} percent made the whole system about {pct // 2 + 5} percent "
        f"faster. The reason is simple: {result}. This is why a careful measurement comes before any change, "
        f"and why the same measurement is repeated after the change, on the same machine and with the same inputs."
    )


def _code(rng: random.Random) -> str:
    name, op = rng.choice(_FUNCS)
    var = rng.choice(("values", "items", "numbers", "scores", "counts"))
    k = rng.randint(2, 9)
    body = f"result = {op}(result, x)" if op in ("max", "min") else f"result = result {op} x"
    start = f"{var}[0]" if op in ("max", "min") else ("1" if op == "*" else "0")
    loop = f"{var}[1:]" if op in ("max", "min") else var
    return (
        f"def {name}_of_{var}({var}):\n"
        f'    """Return the {name} of the {var}, or None when the list is empty."""\n'
        f"    if not {var}:\n        return None\n"
        f"    result = {start}\n"
        f"    for x in {loop}:\n        {body}\n"
        f"    return result\n\n\n"
        f'if __name__ == "__main__":\n'
        f"    data = [{', '.join(str(rng.randint(1, 99)) for _ in range(k))}]\n"
        f"    print({name}_of_{var}(data))\n"
    )


def _dialogue(rng: random.Random) -> str:
    a, b = rng.sample(_NAMES, 2)
    place = rng.choice(_PLACES)
    hour = rng.randint(7, 11)
    return (
        f'"Are you coming to the {place} tomorrow?" {a} asked.\n'
        f'"I think so," said {b}. "What time do you want to meet?"\n'
        f'"Around {hour} o\'clock. The doors open at {hour - 1}, but it is always crowded at first."\n'
        f'"Then let us meet at the corner by the {rng.choice(_PLACES)}. I will bring the {rng.choice(_ITEMS)}."\n'
        f'"Good. And do not forget the list this time," {a} said, laughing.\n'
        f'"I wrote it down twice," {b} answered. "Once on paper and once on my phone."'
    )


_GENRES = (_narrative, _howto, _explainer, _code, _dialogue)


def generated_passages(n: int = DEFAULT_PASSAGES, seed: int = 0) -> list[str]:
    """n passages of 80-250 tokens each: narrative, instructions, explanations, Python code and dialogue."""
    out = []
    for i in range(n):
        rng = random.Random(f"corpus:{seed}:{i}")
        out.append(_GENRES[i % len(_GENRES)](rng))
    return out


def read_text_file(path: Path, what: str) -> str:
    """The file as UTF-8 text; a one-line ValueError when it is binary or not UTF-8."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ValueError(f"{what} {path}: cannot read it ({e.strerror or e})") from None
    nul = data.find(b"\x00", 0, 65536)
    if nul >= 0:
        raise ValueError(f"{what} {path}: expected UTF-8 text, found a NUL byte at offset {nul}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{what} {path}: expected UTF-8 text, found byte 0x{data[e.start]:02x} at offset {e.start}"
        ) from None


def read_corpus(path: Path) -> list[str]:
    """Passages from plain text (separated by blank lines) or JSONL ({"text": ...} per line)."""
    text = read_text_file(path, "corpus")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if lines and lines[0].lstrip().startswith("{"):
        passages = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"corpus {path}:{n}: expected a JSON object with a 'text' field ({e.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("text"), str) or not row["text"].strip():
                raise ValueError(f"corpus {path}:{n}: expected a JSON object with a non-empty 'text' string")
            passages.append(row["text"])
    else:
        passages = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    if not passages:
        raise ValueError(f"corpus {path}: no passages (expected text passages separated by blank lines)")
    long = [i for i, p in enumerate(passages) if len(p) > MAX_PASSAGE_CHARS]
    if long:
        raise ValueError(f"corpus {path}: passage {long[0]} has {len(passages[long[0]])} characters "
                         f"(at most {MAX_PASSAGE_CHARS}; split it at blank lines)")  # fmt: skip
    return passages


def texts_sha256(texts: list[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(hashlib.sha256(t.encode()).digest())
    return h.hexdigest()


# --- word problems -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    id: str
    question: str
    answer: float  # exact; integers for the generated set


def _p_shopping(rng: random.Random) -> tuple[str, int]:
    name, friend = rng.sample(_NAMES, 2)
    item = rng.choice(_ITEMS)
    a, b, c = rng.randint(5, 60), rng.randint(2, 9), rng.randint(3, 24)
    d = rng.randint(1, a + b * c - 1)
    q = (f"{name} has {a} {item}. {name} buys {b} packs with {c} {item} in each pack and then gives {d} {item} "
         f"to {friend}. How many {item} does {name} have now?")  # fmt: skip
    return q, a + b * c - d


def _p_travel(rng: random.Random) -> tuple[str, int]:
    v, h, w, g = rng.randint(30, 120), rng.randint(2, 7), rng.randint(20, 90), rng.randint(1, 5)
    q = (f"A train travels at {v} kilometers per hour for {h} hours, then at {w} kilometers per hour for {g} "
         f"more hours. How many kilometers does it travel in total?")  # fmt: skip
    return q, v * h + w * g


def _p_change(rng: random.Random) -> tuple[str, int]:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    p, n = rng.randint(2, 15), rng.randint(2, 12)
    bill = next(b for b in (20, 50, 100, 200, 500) if b > p * n)
    q = (f"A shop sells {item} for {p} dollars each. {name} buys {n} of them and pays with a {bill} dollar note. "
         f"How many dollars of change does {name} get?")  # fmt: skip
    return q, bill - p * n


def _p_reading(rng: random.Random) -> tuple[str, int]:
    name = rng.choice(_NAMES)
    a, d, b, e = rng.randint(10, 40), rng.randint(2, 6), rng.randint(15, 50), rng.randint(2, 5)
    total = a * d + b * e + rng.randint(10, 300)
    q = (f"A book has {total} pages. {name} reads {a} pages a day for {d} days, then {b} pages a day for {e} "
         f"days. How many pages are left to read?")  # fmt: skip
    return q, total - a * d - b * e


def _p_farm(rng: random.Random) -> tuple[str, int]:
    c, h, s = rng.randint(3, 40), rng.randint(5, 80), rng.randint(0, 12)
    q = f"A farm has {c} cows, {h} hens and {s} sheep. How many legs do these animals have in total?"
    return q, 4 * c + 2 * h + 4 * s


def _p_sharing(rng: random.Random) -> tuple[str, int]:
    n, per, e = rng.randint(3, 12), rng.randint(4, 15), rng.randint(1, 3)
    q = (f"{n} friends share {n * per} cookies equally. Each friend eats {e} of their cookies. "
         f"How many cookies are left in total?")  # fmt: skip
    return q, n * (per - e)


def _p_fence(rng: random.Random) -> tuple[str, int]:
    length, width, price = rng.randint(5, 60), rng.randint(3, 40), rng.randint(2, 25)
    q = (f"A rectangular garden is {length} meters long and {width} meters wide. Fencing costs {price} dollars "
         f"per meter. How many dollars does it cost to fence the whole garden?")  # fmt: skip
    return q, 2 * (length + width) * price


def _p_savings(rng: random.Random) -> tuple[str, int]:
    name = rng.choice(_NAMES)
    s, w = rng.randint(5, 40), rng.randint(4, 20)
    x = rng.randint(1, s * w // 2)
    if (s * w - x) % 2:
        x += 1
    q = (f"{name} saves {s} dollars every week for {w} weeks, spends {x} dollars on a jacket, and then gives half "
         f"of what is left to a sister. How many dollars does {name} have now?")  # fmt: skip
    return q, (s * w - x) // 2


_PROBLEMS = (_p_shopping, _p_travel, _p_change, _p_reading, _p_farm, _p_sharing, _p_fence, _p_savings)


def generated_problems(n: int = DEFAULT_PROBLEMS, seed: int = 0) -> list[Problem]:
    """n two- to four-step arithmetic word problems with exact integer answers."""
    out = []
    for i in range(n):
        rng = random.Random(f"problems:{seed}:{i}")
        question, answer = _PROBLEMS[i % len(_PROBLEMS)](rng)
        out.append(Problem(f"gen{seed}-{i}", question, float(answer)))
    return out


_NUMBER = r"-?\$?\d[\d,]*(?:\.\d+)?"


def parse_number(text: str) -> float | None:
    """'1,234' -> 1234.0, '$5' -> 5.0; None when text is not a number."""
    t = text.strip().rstrip(".").replace(",", "").replace("$", "")
    try:
        return float(t)
    except ValueError:
        return None


def gold_answer(answer: object) -> float | None:
    """A dataset's answer field: a number, or GSM8K's worked solution ending in '#### N'."""
    if isinstance(answer, bool):
        return None
    if isinstance(answer, int | float):
        return float(answer)
    if not isinstance(answer, str):
        return None
    if "####" in answer:
        return parse_number(answer.rsplit("####", 1)[1])
    return parse_number(answer)


def read_dataset(path: Path) -> list[Problem]:
    """GSM8K-style JSONL: {"question": str, "answer": str | number} per line."""
    text = read_text_file(path, "dataset")
    problems = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"dataset {path}:{n}: expected a JSON object ({e.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"dataset {path}:{n}: expected a JSON object, got {type(row).__name__}")
        if not isinstance(row.get("question"), str) or not row["question"].strip():
            raise ValueError(f"dataset {path}:{n}: no 'question' field (expected question and answer)")
        if "answer" not in row:
            raise ValueError(f"dataset {path}:{n}: no 'answer' field (expected question and answer)")
        gold = gold_answer(row["answer"])
        if gold is None:
            raise ValueError(f"dataset {path}:{n}: answer {str(row['answer'])[-60:]!r} is not a number "
                             "(expected a number, or text ending in '#### NUMBER')")  # fmt: skip
        problems.append(Problem(str(row.get("id", f"line{n}")), row["question"], gold))
    if not problems:
        raise ValueError(f"dataset {path}: no problems")
    return problems


PROMPT = (
    "Solve the following problem. Think step by step if you need to, then give the final answer as a number "
    "on the last line, in the form 'Answer: <number>'.\n\n{question}"
)


def extract_answer(text: str) -> float | None:
    """The model's answer: after the last 'Answer:' (or '####'), else the last number in the text."""
    for marker in (r"answer\s*(?:is)?\s*[:=]?\s*\**\s*(" + _NUMBER + ")", r"####\s*(" + _NUMBER + ")"):
        found = re.findall(marker, text, flags=re.IGNORECASE)
        if found:
            return parse_number(found[-1])
    found = re.findall(_NUMBER, text)
    return parse_number(found[-1]) if found else None


def problems_sha256(problems: list[Problem]) -> str:
    return texts_sha256([f"{p.id}\x00{p.question}\x00{p.answer!r}" for p in problems])
