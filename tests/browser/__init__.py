"""Browser tier: the admin driven by a headless Chromium (selenium)."""
