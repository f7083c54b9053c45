"""Writes lazybatch/simulator/data/chat_lengths.json, the chat-like length histogram the decoder LM is served with.

Where its shape comes from: it is synthetic, not fitted to a data set (none can be shipped or fetched here). Chat
assistants' responses are commonly reported as long-tailed: most answers are a few dozen tokens, a few run to
several hundred. A log-normal with a median of 40 tokens and sigma 1.0 has that shape: 50% of lengths within 40,
90% within 144, 99% within about 410, and a mean of about 66; lengths are cut at 384 (the served model's
max_output; the 2% of the mass past it lands on 384). ``lazybatch load`` draws prompt and output lengths from it
independently, each clipped to the model's limits (client/seq2seq.py), so prompts are cut by the 32-token prompt
limit.

    python scripts/make_chat_lengths.py
"""

from __future__ import annotations

import json
import math
from pathlib import Path

MEDIAN, SIGMA, MAX_LEN, TOTAL = 40.0, 1.0, 384, 30_000


def main() -> None:
    def cdf(x: float) -> float:
        return 0.5 * (1 + math.erf((math.log(x) - math.log(MEDIAN)) / (SIGMA * math.sqrt(2))))

    lengths = list(range(1, MAX_LEN + 1))
    mass = [cdf(n + 0.5) - cdf(max(n - 0.5, 1e-9)) for n in lengths]
    mass[-1] += 1 - cdf(MAX_LEN + 0.5)  # the tail past the limit ends at it
    counts = [round(TOTAL * m) for m in mass]
    out = Path(__file__).resolve().parents[1] / "lazybatch" / "simulator" / "data" / "chat_lengths.json"
    out.write_text(json.dumps({
        "format": "lazybatch.length_histogram/1",
        "provenance": f"synthetic chat-like long tail: log-normal, median {MEDIAN:g} tokens, sigma {SIGMA:g}, cut "
                      f"at {MAX_LEN} (scripts/make_chat_lengths.py says why), counts out of {TOTAL:,}",
        "lengths": lengths, "counts": counts}) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
