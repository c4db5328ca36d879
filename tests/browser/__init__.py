"""The chapters opened in a real JupyterLab under headless Chromium (see conftest.py)."""
