"""The UI's look: a few CSS touches on top of Gradio's Soft theme, and what the page's head adds (modules,
not .css/.js files, so that they ship in the wheel without package-data configuration)."""

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

# A refused upload (ui/uploads.py) answers the API's JSON error; Gradio's page shows a failed upload's
# body in its error toast as "HTTP 415: {...}": show just the message (it names the file).
_TIDY_UPLOAD_ERRORS = """<script>
(() => {
  const tidy = (root) => {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let node; (node = walker.nextNode());) {
      const match = /^\\s*HTTP \\d{3}: (\\{[\\s\\S]*\\})\\s*$/.exec(node.data);
      if (!match || !node.parentElement || !node.parentElement.closest('[data-testid="toast-body"]')) continue;
      try {
        const error = JSON.parse(match[1]).error;
        if (error && typeof error.message === "string") node.data = error.message;
      } catch (_) { /* not an API error: leave it */ }
    }
  };
  new MutationObserver((changes) => changes.forEach((change) => {
    const target = change.type === "characterData" ? change.target.parentNode : change.target;
    if (target) tidy(target);
  })).observe(document.documentElement, {childList: true, subtree: true, characterData: true});
})();
</script>"""
# An inline icon: browsers ask for /favicon.ico otherwise, which the API answers 404.
HEAD = ('<link rel="icon" href="data:image/svg+xml,<svg xmlns=%22http://www.w3.org/2000/svg%22 '
        'viewBox=%220 0 100 100%22><text y=%22.9em%22 font-size=%2290%22>🔍</text></svg>">'
        + _TIDY_UPLOAD_ERRORS)
