// The parsed form of a template: statements holding expressions. Built by the parser, read by the
// interpreter; a Template owns the tree, and macros defined in it point into it while it renders.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tandem/server/jinja/value.h"

namespace tandem::server::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // value
    kName,     // name
    kList,     // items
    kTuple,    // items (a tuple is a list here; templates only iterate and unpack them)
    kDict,     // items: key, value, key, value, ...
    kAttr,     // object.name
    kItem,     // object[items[0]]
    kSlice,    // object[items[0]:items[1]:items[2]], null where omitted
    kCall,     // object(args, kwargs)
    kFilter,   // object|name(args, kwargs); object null in a {% filter %} block's chain
    kTest,     // object is [not] name(args, kwargs)
    kNeg,      // -object
    kPos,      // +object
    kNot,      // not object
    kBinary,   // object name items[0], name one of + - * / // % **
    kConcat,   // items joined with ~
    kCompare,  // object ops[0] items[0] ops[1] items[1] ... (chained as in Python)
    kAnd,      // object and items[0]
    kOr,       // object or items[0]
    kCond,     // object if items[0] else items[1] (items[1] null: undefined)
  };
  Kind kind;
  int line = 0, column = 0;
  int depth = 1;  // levels of the tree below and including this node (the parser bounds it)
  Value value;
  std::string name;
  ExprPtr object;
  std::vector<ExprPtr> items;
  std::vector<std::string> ops;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // branches: (condition, body) in order; the else branch has a null condition
    kFor,          // for targets in expr [if filter]: body [else: else_body]
    kSet,          // set targets = expr, or set targets[0].attribute = expr
    kSetBlock,     // set targets[0] %}body{% endset, optionally through filter
    kMacro,        // macro name(params = defaults): body
    kFilterBlock,  // filter chain (filter) over body
    kWith,         // with targets = values: body
    kBreak,
    kContinue,
    kBlock,  // a body with no effect of its own ({% generation %})
  };
  Kind kind;
  int line = 0, column = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<std::string> targets;
  std::string attribute;  // kSet: the namespace attribute assigned, when not empty
  Body body, else_body;
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> values;  // kMacro: defaults (null where none); kWith: one per target
};

}  // namespace tandem::server::jinja
