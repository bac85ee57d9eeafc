"""constrained/gbnf.py: what GBNF has and xgrammar's EBNF lacks, translated (xgrammar then parses
the result) or refused naming the line."""

import pytest

from radixlm.constrained.gbnf import ANY_CHAR, GBNFError, check_gbnf, gbnf_to_ebnf


@pytest.mark.parametrize(
    "gbnf, ebnf",
    [
        ('ws ::= | " "\nroot ::= ws', 'ws ::= "" | " "\nroot ::= ws'),
        ('root ::= ("a" |)', 'root ::= ("a" | "")'),
        ('root ::= "a" ( | "b")', 'root ::= "a" ( "" | "b")'),
        ('root ::= "a" |', 'root ::= "a" | ""'),
        ('root ::= x\nx ::=\ny ::= "b"', 'root ::= x\nx ::= ""\ny ::= "b"'),
        ('root ::= . "."', f'root ::= {ANY_CHAR} "."'),  # a dot in a string stays
        ('root ::= [.|(] "|" # a | comment', 'root ::= [.|(] "|" # a | comment'),
    ],
)
def test_translation(gbnf, ebnf):
    assert gbnf_to_ebnf(gbnf) == ebnf
    check_gbnf(gbnf)  # xgrammar parses it


@pytest.mark.parametrize(
    "gbnf, words",
    [
        ('root ::= "a"\nthink ::= <think>', "line 2: token matches"),
        ("root ::= !<[12]>", "line 1: token matches"),
        ('root ::= "a', "unterminated"),
        ("root ::= undefined", 'Rule "undefined" is not defined'),
    ],
)
def test_refusals(gbnf, words):
    with pytest.raises(GBNFError, match=words):
        check_gbnf(gbnf)
