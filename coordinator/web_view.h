// The dashboard's HTML (coordinator/web.h): Mustache templates, one a page, in
// coordinator/web/templates/ and compiled into ring-coord at build time
// (coordinator/web/embed_templates.cmake writes kWebTemplates), rendered with kainjow's
// header-only renderer (Debian: libkainjow-mustache-dev). The pages' code builds the data (strings,
// booleans, lists; numbers formatted there) and the templates hold all the markup.
//
// Every {{value}} is HTML-escaped (html_escape); the embedding refuses templates with unescaped
// tags ({{{x}}}, {{&x}}), so no value from a job, a user or an event can become markup.
//
//   mustache::data d;
//   d.set("name", job.name);
//   std::string html = render_page("job", "job 1: " + job.name, d);
#pragma once

#include <kainjow/mustache.hpp>

#include <cstddef>
#include <string>
#include <string_view>

namespace ring::coord {

namespace mustache = kainjow::mustache;

// A template: its file name without .mustache, and its text.
struct WebTemplate {
  const char* name;
  std::string_view text;
};
extern const WebTemplate kWebTemplates[];
extern const size_t kWebTemplateCount;

// &, <, >, " and ' as entities; control characters other than tab and newline as U+FFFD.
std::string html_escape(const std::string& s);

// The template `page` inside the "layout" template (head, style, footer), which shows `title`.
// Every template is a partial of every other ({{>line_chart}}); the page is the partial "body".
// Throws std::logic_error for a template that is missing or does not parse (a defect of the
// build, which tests/web's page tests would show).
std::string render_page(const std::string& page, const std::string& title, mustache::data d);

}  // namespace ring::coord
