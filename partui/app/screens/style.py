"""The app's stylesheet: laid out to work at 80x24 and larger."""

CSS = """
#setup-body { height: 1fr; }
#presets { width: 24; }
#mesh { width: 34; padding: 0 1; }
#mesh-grid { grid-size: 4; grid-columns: 14 4 9 5; grid-rows: 1; height: 4; }
#mesh-grid Label { padding: 0 0 0 1; }
.field { border: none; height: 1; padding: 0; }
#model { width: 1fr; padding: 0 1; }
.labelled { height: 3; }
.select-label { width: 9; padding: 1 0 0 0; }
.labelled Select { width: 1fr; }
#model-label { width: 6; }
#model-info { height: auto; margin: 1 0; }
#status { height: 2; padding: 0 1; }
#status.-invalid { background: $error 15%; }
#progress { height: 1; padding: 0 1; }
#command { border: none; height: 1; background: $panel; }
#run-top { height: auto; max-height: 3; }
#run-status { width: 1fr; height: auto; padding: 0 1; }
#loss { width: 30; height: 2; }
RunScreen.-narrow #loss { width: 10; }
#run-body { height: 1fr; }
#cards { width: 30; }
RunScreen.-narrow #cards, RunScreen.-wide.-cards-toggled #cards { display: none; }
RunScreen.-narrow.-cards-toggled #cards { display: block; }
.rank-card { border: round $primary-darken-2; height: auto; padding: 0 1; }
.rank-card.-selected { border: round $accent; }
#inspector { width: 1fr; }
#trace-bar { height: 1; }
#trace-name { width: 16; }
#report-rank, #report-step, #report-pipe { height: auto; max-height: 10; margin: 1 0 0 0; }
#mesh-hint { color: $warning; }
#mesh-view { margin: 1 0 0 0; }
#mesh-table { height: auto; }
#help-box, #error-box, #mesh-box { width: 90%; height: auto; max-height: 90%; margin: 1 4;
                        border: thick $accent; background: $surface; padding: 0 1; }
#error-box { border: thick $error; }
#error-title { text-style: bold; color: $error; }
#error-detail { height: auto; max-height: 12; }
HelpScreen, ErrorDialog, MeshScreen { align: center middle; }
"""
