"""The app's stylesheet: laid out to work at 80x24 and larger."""

CSS = """
#setup-body { height: 1fr; }
#presets { width: 20; height: 1fr; border: none; padding: 0; }   /* every preset above the fold */
#presets:focus { background-tint: $foreground 5%; }
#form { width: 1fr; padding: 0 0 0 2; }
#mesh-grid { grid-size: 6; grid-columns: 13 6 8 6 6 6; grid-rows: 1; height: 3; }
.field { border: none; height: 1; padding: 0; }
#choices { grid-size: 4; grid-columns: 9 18 11 1fr; grid-rows: 1; height: auto; margin: 1 0 0 0; }
#choices Select { width: 1fr; }
#model-info { height: auto; margin: 1 0 0 0; color: $text-muted; }
#status { height: auto; margin: 1 0 0 0; }
#status.-invalid { background: $error 15%; }
#progress { height: auto; }
#buttons { height: 1; margin: 1 0 0 0; }
#buttons Button { margin: 0 2 0 0; }
#command { border: none; height: 1; background: $panel; }
#run-top { height: auto; max-height: 3; }
#run-status { width: 1fr; height: auto; padding: 0 1; }
#loss { width: 30; height: 2; }
RunScreen.-narrow #loss { width: 10; }
#run-body { height: 1fr; }
#cards { width: 30; }
RunScreen.-narrow #cards, RunScreen.-wide.-cards-toggled #cards { display: none; }
RunScreen.-narrow.-cards-toggled #cards { display: block; }
RunScreen.-narrow.-cards-toggled Tab { padding: 0 0 0 1; }   /* seven tabs beside the cards */
Toast { width: 44; max-width: 60%; }
.rank-card { border: round $primary-darken-2; height: auto; padding: 0 1; }
.rank-card.-selected { border: round $accent; }
#inspector { width: 1fr; }
#trace-bar { height: 1; }
#trace-name { width: 16; }
#report-rank, #report-step, #report-pipe { height: auto; max-height: 10; margin: 1 0 0 0; }
#mesh-hint { color: $warning; }
#mesh-view { margin: 1 0 0 0; }
#mesh-table { height: auto; }
#help-box, #error-box, #mesh-box, #text-box { width: 90%; height: auto; max-height: 100%; margin: 0 2;
                        border: thick $accent; background: $surface; padding: 0 1; }
.dialog { height: 100%; }                    /* a body that scrolls, its Close button below it */
.dialog-body { height: 1fr; }
#help-close, #mesh-close, #text-close { margin: 1 0 0 0; }
#text-title { text-style: bold; }
#error-box { border: thick $error; }
#error-title { text-style: bold; color: $error; }
#error-detail { height: auto; max-height: 12; }
HelpScreen, ErrorDialog, MeshScreen, TextDialog { align: center middle; }
"""
