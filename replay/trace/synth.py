"""Deterministic synthetic text: trace content that costs a few bytes to store.

A message content `{"synth": {"tokens": N, "seed": S}}` stands for about N tokens of English-like
text. Equal (N, S) always give the identical string, so two requests that share a synthetic prefix
share it byte for byte, as they would on a real server's prompt cache. Words are drawn from common
English words that typical BPE tokenizers (cl100k, o200k, Llama 3) encode as one token each with
their leading space; the measured ratio is in traces/FORMAT.md.
"""

from __future__ import annotations

import random
from collections import OrderedDict

WORDS: tuple[str, ...] = tuple(
    dict.fromkeys(
        """the of and to in is that for it as was with be by on not he this are or his from at which
but have an they you were her she there one all we their has been if more when will would who so no
time can out up about into them some could other than then now only its over also new after first
two may any these see way use like our just people made well should because how each between most
over back years work after state city world still good through never last long great little own
right old big high different small large next early young important few public same able much
house school group country problem hand part place case week company system program question
government number night point home water room mother area money story fact month lot study book eye
job word business issue side kind head far black long both little service friend father power hour
game line end member law car name president team minute idea body information nothing ago lead
social understand whether watch together follow around parent stop face anything create public
already speak others read level allow add office spend door health person art sure war history
party within grow result open change morning walk reason low win research girl guy early food
before moment himself air teacher force offer enough education across although remember foot
second boy maybe toward able age policy everything love process music including consider appear
actually buy probably human wait serve market die send expect sense build stay fall oh nation plan
cut college interest death course someone experience behind reach local kill six remain effect
yeah suggest class control raise care perhaps late hard field else pass former sell major
sometimes require along development themselves report role better economic effort decide rate
strong possible heart drug show leader light voice wife whole police mind finally pull return free
military price less according decision explain son hope develop view relationship carry town road
drive arm true federal break difference thank receive value international building action full
model join season society tax director position player agree especially record pick wear paper
special space ground form support event official whose matter everyone center couple site project
hit base activity star table need court produce eat american teach oil half situation easy cost
industry figure street image itself phone either data cover quite picture clear practice piece land
recent describe product doctor wall patient worker news test movie certain north personal simply
third technology catch step baby computer type attention draw film tree source red nearly
organization choose cause hair century evidence window difficult listen soon culture billion chance
brother energy period summer realize hundred available plant likely opportunity term short letter
condition choice single rule daughter administration south husband floor campaign material
population economy medical hospital church close thousand risk current fire future wrong involve
defense anyone increase security bank myself certainly west sport board seek per subject officer
private rest behavior deal performance fight throw top quickly past goal bed order author fill
represent focus foreign drop blood upon agency push nature color recently store reduce sound note
fine near movement page enter share than common poor natural race concern series significant
similar hot language each usually response dead rise animal factor decade article shoot east save
seven artist away scene stock career despite central eight thus treatment beyond happy exactly
protect approach lie size dog fund serious occur media ready sign thought list individual simple
quality pressure accept answer resource identify left meeting determine prepare disease whatever
success argue cup particularly amount ability staff recognize indicate character growth loss degree
wonder attack herself region television box training pretty trade election everybody physical lay
general feeling standard bill message fail outside arrive analysis benefit sex forward lawyer present
section environmental glass skill sister professor operation financial crime stage ok compare
authority miss design sort act ten knowledge gun station blue state strategy clearly discuss
indeed truth song example democratic check environment leg dark various rather laugh guess
executive prove hang entire rock forget claim remove manager enjoy network legal religious cold
final main science green memory card above seat cell establish nice trial expert spring firm radio
visit management avoid imagine tonight huge ball finish yourself theory impact respond statement
maintain charge popular traditional onto reveal direction weapon employee cultural contain peace
pain apply play measure wide shake fly interview manage chair fish particular camera structure
politics perform bit weight suddenly discover candidate production treat trip evening affect inside
conference unit style adult worry range mention deep edge specific writer trouble necessary
throughout challenge fear shoulder institution middle sea dream bar beautiful property instead
improve stuff""".split()
    )
)

_WORD_BYTES = sum(len(w) + 1 for w in WORDS) / len(WORDS)


_CACHE_BYTES = 64 << 20
_cache: OrderedDict[tuple[int, int], str] = OrderedDict()
_cached_bytes = 0


def synth_text(tokens: int, seed: int) -> str:
    """About `tokens` tokens of text.

    Identical for equal arguments, different for different seeds, and the text for fewer tokens is
    a prefix (in words) of the text for more tokens with the same seed. Recent texts are kept up to
    64 MiB in all (bounded by size, not count: one 130K-token text is 0.8 MB).
    """
    global _cached_bytes
    key = (tokens, seed)
    text = _cache.get(key)
    if text is not None:
        _cache.move_to_end(key)
        return text
    text = _generate(tokens, seed)
    _cache[key] = text
    _cached_bytes += len(text)
    while _cached_bytes > _CACHE_BYTES and len(_cache) > 1:
        _cached_bytes -= len(_cache.popitem(last=False)[1])
    return text


def _generate(tokens: int, seed: int) -> str:
    if tokens <= 0:
        return ""
    rng = random.Random(seed)
    return " ".join(rng.choices(WORDS, k=tokens))


def approx_bytes(tokens: int) -> int:
    """Expected UTF-8 size of synthetic text of `tokens` tokens (for sizing without generating it)."""
    return int(tokens * _WORD_BYTES)
