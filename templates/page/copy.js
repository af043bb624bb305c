// The release page's copy buttons. Without this script the page reads the same: each start command is a plain code
// block. With it, each block gets a button that puts the block's text on the clipboard (textContent in, textContent
// out: nothing from the page is ever parsed as HTML), or, where the clipboard is refused, selects the text.
(function () {
  "use strict";
  function select(node) {
    var range = document.createRange();
    range.selectNodeContents(node);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }
  document.querySelectorAll("pre[data-copy]").forEach(function (pre) {
    var button = document.createElement("button");
    button.type = "button";
    button.className = "copy";
    button.textContent = "Copy";
    button.addEventListener("click", function () {
      var text = pre.textContent;
      var done = function () { button.textContent = "Copied"; button.setAttribute("data-copied", "yes"); };
      var refused = function () { select(pre); button.textContent = "Selected: press Ctrl+C"; };
      if (navigator.clipboard && navigator.clipboard.writeText) {
        navigator.clipboard.writeText(text).then(done, refused);
      } else {
        refused();
      }
    });
    pre.parentNode.insertBefore(button, pre);
  });
})();
