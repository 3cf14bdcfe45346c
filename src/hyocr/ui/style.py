"""The UI's CSS: a few touches on top of Gradio's Soft theme (a module, not a .css file, so that it
ships in the wheel without package-data configuration)."""

CSS = """
.gradio-container { max-width: 1320px !important; margin: 0 auto !important; }
.hy-header { display: flex; flex-wrap: wrap; align-items: baseline; justify-content: space-between; gap: 8px; }
.hy-header h1 { margin: 0; font-size: 1.9rem; font-weight: 700; letter-spacing: -0.02em; }
.hy-header h1 span { font-size: 1.05rem; font-weight: 400; color: var(--body-text-color-subdued); margin-left: 10px; }
.hy-badges { display: flex; flex-wrap: wrap; gap: 6px; }
.hy-badge { font-size: 0.8rem; padding: 2px 10px; border-radius: 999px;
  background: var(--background-fill-secondary); border: 1px solid var(--border-color-primary); }
.hy-steps p { margin: 0.1em 0; color: var(--body-text-color-subdued); }
.hy-note { font-size: 0.9rem; }
.hy-status { padding: 10px 14px; border-radius: 8px; font-weight: 500; border: 1px solid transparent;
  background: var(--background-fill-secondary); }
.hy-busy { background: #eef2ff; border-color: #c7d2fe; color: #3730a3; }
.hy-ok { background: #ecfdf5; border-color: #a7f3d0; color: #065f46; }
.hy-warn { background: #fffbeb; border-color: #fde68a; color: #92400e; }
.hy-error { background: #fef2f2; border-color: #fecaca; color: #991b1b; }
.hy-stats { display: flex; flex-wrap: wrap; gap: 6px; }
.hy-chip { font-size: 0.8rem; padding: 3px 10px; border-radius: 6px; background: var(--background-fill-secondary);
  border: 1px solid var(--border-color-primary); }
.hy-chip i { font-style: normal; color: var(--body-text-color-subdued); margin-right: 4px; }
.hy-rendered table { border-collapse: collapse; }
.hy-rendered td, .hy-rendered th { border: 1px solid var(--border-color-primary); padding: 4px 8px; }
#hy-text textarea { font-family: var(--font-mono); font-size: 0.9rem; }
"""
