"""Path postfix templates now live in `broker/protocol/path_postfix.py` (spec validation checks
them, and the protocol layer must not import the fragment layer); re-exported here for callers
of the old path."""

from __future__ import annotations

from broker.protocol.path_postfix import Field as Field
from broker.protocol.path_postfix import PostfixTemplate as PostfixTemplate
from broker.protocol.path_postfix import PostfixTemplateError as PostfixTemplateError
from broker.protocol.path_postfix import PostfixValues as PostfixValues
from broker.protocol.path_postfix import check_template as check_template
from broker.protocol.path_postfix import evaluate as evaluate
from broker.protocol.path_postfix import parse_template as parse_template
from broker.protocol.path_postfix import postfix_of as postfix_of
