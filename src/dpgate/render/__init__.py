"""The gateway's generated SQL built as sqlglot trees (issue 20 step 4, DESIGN.md "Compile once").

Engines receive these trees and only transform them (no SQL text is parsed after planning).
"""
