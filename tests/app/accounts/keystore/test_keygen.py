import re

from app.accounts.keystore import keygen


def test_a_key_is_the_prefix_and_43_random_characters():
    issued = keygen.issue()
    assert re.fullmatch(r"sai-[A-Za-z0-9_-]{43}", issued.secret)
    assert keygen.is_well_formed(issued.secret)
    assert len({keygen.issue().secret for _ in range(1000)}) == 1000


def test_only_the_hash_and_the_display_form_leave_the_issuer():
    issued = keygen.issue()
    assert issued.hash == keygen.hash_key(issued.secret)
    assert re.fullmatch(r"[0-9a-f]{64}", issued.hash)
    assert issued.display == f"sai-...{issued.secret[-4:]}"
    assert issued.secret not in repr(issued)


def test_malformed_tokens():
    good = keygen.issue().secret
    for token in (
        "",
        "sai-",
        good[:-1],
        good + "x",
        "sk-" + good[4:],
        good[:10] + "!" + good[11:],
        " " + good,
    ):
        assert not keygen.is_well_formed(token), token
