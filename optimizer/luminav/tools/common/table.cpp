// tools/common/table.cpp: the one table printer of the luminav subcommands (see table.h)
#include "common/table.h"

#include <algorithm>
#include <cstddef>
#include <iostream>

namespace luminav {
namespace tools {

void print_table(const std::vector<std::vector<std::string>>& rows, const TableStyle& style) {
  std::vector<std::size_t> width;
  for (const auto& r : rows) {
    width.resize(std::max(width.size(), r.size()), 0);
    for (std::size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::string line = style.indent;
    for (std::size_t c = 0; c < rows[i].size(); ++c) {
      const std::string& cell = rows[i][c];
      const std::string pad(width[c] - cell.size(), ' ');
      const bool last = c + 1 == rows[i].size();
      if (style.numbers_right && c > 0) {
        line += pad + cell;
      } else {
        line += last ? cell : cell + pad;
      }
      if (!last) line += "  ";
    }
    std::cout << line << "\n";
    if (i == 0) {
      std::size_t total = 0;
      for (std::size_t c = 0; c < width.size(); ++c) total += width[c] + (c + 1 < width.size() ? 2 : 0);
      std::cout << style.indent << std::string(total, '-') << "\n";
    }
  }
}

}  // namespace tools
}  // namespace luminav
