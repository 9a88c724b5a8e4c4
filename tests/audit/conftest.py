"""The training tests' mixes and honest reference run, shared with the audit tests; and the
run explorer's subject, a micro run whose corpus holds markup and script."""
import pytest

from tests.train.conftest import _one_thread  # noqa: F401


@pytest.fixture(scope="session")
def site_run(tmp_path_factory):
    """testkit/sitefixture.py: a micro run, documents with script, one step certified."""
    import torch

    from testkit.sitefixture import make_site_run
    from testkit.runs import cli_env

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return make_site_run(tmp_path_factory.mktemp("site"), cli_env())
    finally:
        torch.set_num_threads(n)


@pytest.fixture(scope="session")
def site_dir(site_run, tmp_path_factory) -> str:
    """The explorer of ``site_run`` written as a static site (every step)."""
    from open1b_audit.site.data import Explorer
    from open1b_audit.site.static import write_site

    out = str(tmp_path_factory.mktemp("explorer") / "site")
    write_site(Explorer.open(site_run.run, site_run.mix, site_run.certs), out)
    return out


@pytest.fixture(scope="session")
def paged_site_dir(site_run, tmp_path_factory) -> str:
    """``site_run`` written with 3 windows a page: its steps of 4 windows take the large-step
    layout (a window index, window pages of 3 and 1 windows, a statistics page)."""
    from open1b_audit.site.data import Explorer
    from open1b_audit.site.static import write_site
    from testkit.sitefixture import PAGE

    out = str(tmp_path_factory.mktemp("explorer") / "paged")
    ex = Explorer.open(site_run.run, site_run.mix, site_run.certs)
    ex.page_windows = PAGE
    write_site(ex, out)
    return out
