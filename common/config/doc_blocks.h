// Generated blocks inside a hand-written document: the reference tables of docs/config.md
// come from the knob table, the prose around them does not.
//
// A block named NAME sits between two marker lines:
//
//   <!-- TAG:NAME begin ... -->      (the rest of the line is free: say where it comes from)
//   ...generated content...
//   <!-- TAG:NAME end -->
//
// ReplaceGeneratedBlocks swaps in fresh content for every block; the text outside the markers
// is kept byte for byte, so regenerating twice changes nothing.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace bitpush::config {

// (name, content without a trailing newline) per block.
using DocBlocks = std::vector<std::pair<std::string, std::string>>;

// `doc` with every block's content replaced. InvalidArgument naming the problem when a block
// of `blocks` has no markers in `doc` (or they are out of order or repeated), or `doc` has a
// block with this tag that `blocks` does not know.
StatusOr<std::string> ReplaceGeneratedBlocks(std::string_view doc, std::string_view tag,
                                             const DocBlocks& blocks);

// The begin and end marker lines of block `name` (without newlines).
std::string BlockBeginMarker(std::string_view tag, std::string_view name, std::string_view note);
std::string BlockEndMarker(std::string_view tag, std::string_view name);

}  // namespace bitpush::config
