#include "coordinator/web_view.h"

#include <map>
#include <stdexcept>

namespace ring::coord {

namespace {

std::string_view template_text(const std::string& name) {
  for (size_t i = 0; i < kWebTemplateCount; ++i)
    if (name == kWebTemplates[i].name) return kWebTemplates[i].text;
  throw std::logic_error("no web template '" + name + "' (coordinator/web/templates/)");
}

// The page's data for {{values}}; the embedded templates for {{>partials}}. Kept apart so that a
// template's name never hides a value of the same name.
class PageContext : public mustache::basic_context<std::string> {
 public:
  PageContext(const mustache::data* root, const std::string& page) : page_(page) {
    values_.push(root);
  }
  void push(const mustache::data* d) override { values_.push(d); }
  void pop() override { values_.pop(); }
  const mustache::data* get(const std::string& name) const override { return values_.get(name); }
  const mustache::data* get_partial(const std::string& name) const override {
    auto it = partials_.find(name);
    if (it == partials_.end())
      it = partials_.emplace(name, std::string(template_text(name == "body" ? page_ : name))).first;
    return &it->second;
  }

 private:
  std::string page_;
  mustache::context<std::string> values_;
  mutable std::map<std::string, mustache::data> partials_;  // name -> text, as asked for
};

}  // namespace

std::string html_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (unsigned char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      case '\'':
        o += "&#39;";
        break;
      default:
        if (c < 0x20 && c != '\n' && c != '\t')
          o += "&#xFFFD;";
        else
          o += static_cast<char>(c);
    }
  }
  return o;
}

std::string render_page(const std::string& page, const std::string& title, mustache::data d) {
  d.set("title", title);
  mustache::mustache layout{std::string(template_text("layout"))};
  layout.set_custom_escape(html_escape);
  if (!layout.is_valid())
    throw std::logic_error("web template 'layout': " + layout.error_message());
  PageContext ctx(&d, page);
  std::string out = layout.render(ctx);
  if (!layout.is_valid())  // a partial that does not parse
    throw std::logic_error("web template '" + page + "': " + layout.error_message());
  return out;
}

}  // namespace ring::coord
