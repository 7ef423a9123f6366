// tools/common/table.h: the one table printer of the luminav subcommands
#pragma once

#include <string>
#include <vector>

namespace luminav {
namespace tools {

// How a table is laid out: each line after `indent`; columns two spaces apart; with
// `numbers_right`, every column but the first right-aligned (bench's metrics), else all
// left-aligned (inspect's variants).
struct TableStyle {
  std::string indent;
  bool numbers_right = false;
};

// Prints rows[0] as the header, a rule of '-' under it, then the other rows, on stdout.
void print_table(const std::vector<std::vector<std::string>>& rows, const TableStyle& style = TableStyle());

}  // namespace tools
}  // namespace luminav
