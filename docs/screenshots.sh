#!/usr/bin/env bash
# The screenshots of docs/reports.md and the README: runs each family's report command in a temporary
# folder, opens the report in headless Chromium at 1280 px wide, crops the empty bottom of the page and
# writes docs/img/report-<name>.png (192-colour PNG, at most MAX_HEIGHT pixels tall, 100 % zoom). The
# private demo's screenshot starts at its "Convergence" section (the part that differs from the plain demo).
#
#   apt-get install -y chromium        # once
#   bash docs/screenshots.sh           # PYTHON=/path/to/python to choose the interpreter with fedhier
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
MAX_HEIGHT=${MAX_HEIGHT:-7000}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
export OPENBLAS_NUM_THREADS=1

$PY -m fedhier.cli demo --out demo --quiet
$PY -m fedhier.cli demo --dp --unit site --out demo-dp --quiet
zcat "$ROOT/src/fedhier/data/bundled/fedlin/radon.csv.gz" > radon.csv
$PY -m fedhier.cli fit linear radon.csv --site county.name --target log.radon --features basement,uranium \
    --intercept --out fedlin
cp "$ROOT/src/fedhier/data/bundled/anomaly/suthaharan_multi_hop.csv.gz" sensors.csv.gz
$PY -m fedhier.cli collab fit --csv sensors.csv.gz --site-column mote_id --drop-columns reading,indoor \
    --label-column label --out collab/model.npz

shot() {  # shot FOLDER NAME [SECTION]: FOLDER/report.html (from heading SECTION on) -> docs/img/report-NAME.png
    local profile page="$1/report.html"
    if [ $# -ge 3 ]; then  # the page's title, then the sections from SECTION on
        page="$1/report-from-section.html"
        $PY -c 'import sys; html = open(sys.argv[1], encoding="utf-8").read()
open(sys.argv[3], "w", encoding="utf-8").write(html[: html.index("</h1>") + 5] + html[html.index(f"<h2>{sys.argv[2]}</h2>"):])' \
            "$1/report.html" "$3" "$page"
    fi
    profile=$(mktemp -d)
    chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
        --disable-component-update --disable-sync --hide-scrollbars --user-data-dir="$profile" \
        --screenshot="$WORK/$2.png" --window-size=1280,$MAX_HEIGHT "file://$WORK/$page" 2>/dev/null
    rm -rf "$profile"
    mkdir -p "$ROOT/docs/img"
    $PY - "$WORK/$2.png" "$ROOT/docs/img/report-$2.png" <<'EOF'
import sys

import numpy as np
from PIL import Image

image = Image.open(sys.argv[1]).convert("RGB")
grey = np.asarray(image.convert("L"))
used = np.flatnonzero((grey < 250).any(axis=1))
image = image.crop((0, 0, image.width, min(image.height, int(used.max()) + 24)))
image.convert("P", palette=Image.Palette.ADAPTIVE, colors=192).save(sys.argv[2], optimize=True)
print(f"{sys.argv[2]}: {image.width} x {image.height}")
EOF
}

shot demo demo
shot demo-dp demo-dp Convergence
shot fedlin fedlin
shot collab collab
