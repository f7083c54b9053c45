import pytest

from .simhelpers import flat_table


@pytest.fixture
def eight_nodes():
    return flat_table(8)
