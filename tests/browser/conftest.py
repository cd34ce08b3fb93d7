def pytest_configure(config):
    config.addinivalue_line(
        "markers", "browser: real-browser test (JupyterLab + Playwright + Debian chromium)")
