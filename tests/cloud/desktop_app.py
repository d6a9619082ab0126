#!/usr/bin/env python3
"""The desktop test image's GUI program (tests/cloud/build_desktop.py installs it): a
full-screen Tk window whose widgets sit at fixed pixels and which appends every input event
it receives as one JSON object per line to LOG, so that a test can check that a click, a drag,
a wheel turn or a key landed on the widget it aimed at, with the buttons and modifiers it
meant.

Widgets (pixels of the root window; the window is full screen, so they are screen pixels):
  ok       button  (40, 40)   160x60, red          "button" event when activated
  cancel   button  (240, 40)  160x60, blue
  entry    entry   (40, 140)  400x44               "text" events (its whole value)
  scale    scale   (40, 220)  600x60, 0..100       "scale" events (its value)
  list     listbox (40, 320)  300x300, 100 items   "select" (selected items), "yview"
  canvas   canvas  (400, 320) 600x400, white       "motion" count in "release"; right
                                                    click opens a menu ("menu_shown" with
                                                    the entries' centres, "menu" when chosen)
Every widget logs "press", "release" and "double" (button, widget-relative x, y, root x, y,
modifiers) and "key" (keysym, char, modifiers); every record has "t", the guest's wall clock
when the program saw it. The first record is "ready" with the screen
size, the pid and every widget's root rectangle (and the scale's slider centres at 0, 50
and 100, and the visible list items' centres); "layout" follows whenever the window's size changes (a new screen mode).

Usage: desktop_app.py LOG
"""
import json
import os
import sys
import time
import tkinter as tk

MODS = [(0x1, "shift"), (0x4, "control"), (0x8, "alt"), (0x100, "button1"),
        (0x200, "button2"), (0x400, "button3")]
LAYOUT = {
    "ok": (40, 40, 160, 60),
    "cancel": (240, 40, 160, 60),
    "entry": (40, 140, 400, 44),
    "scale": (40, 220, 600, 60),
    "list": (40, 320, 300, 300),
    "canvas": (400, 320, 600, 400),
}
MENU_ITEMS = ["Copy", "Paste", "Delete"]


class App:
    def __init__(self, log_path):
        self.log = open(log_path, "a", buffering=1)
        self.root = tk.Tk(className="mcqemu-desktop")
        self.root.title("mcqemu desktop test")
        self.root.configure(bg="#e0e0e0")
        self.root.attributes("-fullscreen", True)
        self.widgets = {}
        self.drag = None
        self.size = None
        self.build()
        self.root.bind("<Configure>", self.on_configure)
        self.root.after(300, self.ready)

    def emit(self, **rec):
        # The guest's wall clock when the program saw it: the live view's click latency.
        rec["t"] = time.time()
        self.log.write(json.dumps(rec, sort_keys=True) + "\n")

    def build(self):
        r = self.root
        font = ("DejaVu Sans", 16)
        w = self.widgets
        w["ok"] = tk.Button(r, text="OK", bg="#d03030", activebackground="#d03030",
                            font=font, command=lambda: self.emit(event="button", widget="ok"))
        w["cancel"] = tk.Button(r, text="Cancel", bg="#3050d0", activebackground="#3050d0",
                                font=font,
                                command=lambda: self.emit(event="button", widget="cancel"))
        self.text = tk.StringVar(r)
        self.text.trace_add("write", lambda *_: self.emit(event="text", widget="entry",
                                                           value=self.text.get()))
        # A steady insertion cursor: a blinking one would change the screen by itself.
        w["entry"] = tk.Entry(r, textvariable=self.text, font=font, insertofftime=0)
        w["scale"] = tk.Scale(r, from_=0, to=100, orient="horizontal", length=600,
                              sliderlength=40, width=24, font=font, bg="#30a030",
                              command=lambda v: self.emit(event="scale", widget="scale",
                                                          value=int(float(v))))
        w["list"] = tk.Listbox(r, selectmode="extended", font=font, exportselection=False,
                               yscrollcommand=self.on_yview)
        for i in range(100):
            w["list"].insert("end", "item %02d" % i)
        w["list"].bind("<<ListboxSelect>>", self.on_select)
        w["canvas"] = tk.Canvas(r, bg="white", highlightthickness=0)
        self.menu = tk.Menu(r, tearoff=0, font=font)
        for item in MENU_ITEMS:
            self.menu.add_command(label=item,
                                  command=lambda i=item: self.emit(event="menu", item=i))
        for name, (x, y, width, height) in LAYOUT.items():
            w[name].place(x=x, y=y, width=width, height=height)
            self.bind_common(name, w[name])
        c = w["canvas"]
        c.bind("<B1-Motion>", self.on_motion, add="+")
        w["entry"].focus_set()

    def bind_common(self, name, widget):
        def pointer(kind):
            def handler(e):
                rec = dict(event=kind, widget=name, button=e.num, x=e.x, y=e.y,
                           root=[e.x_root, e.y_root], mods=mods(e.state))
                if kind == "press" and name == "canvas" and e.num == 1:
                    self.drag = {"from": [e.x, e.y], "moves": 0}
                if kind == "release" and name == "canvas" and self.drag and e.num == 1:
                    rec["drag_from"] = self.drag["from"]
                    rec["moves"] = self.drag["moves"]
                    self.drag = None
                self.emit(**rec)
                # One binding per event and widget: a <ButtonPress-3> of its own would
                # replace this one for the right button.
                if kind == "press" and name == "canvas" and e.num == 3:
                    self.on_menu(e)
            return handler
        widget.bind("<ButtonPress>", pointer("press"), add="+")
        widget.bind("<ButtonRelease>", pointer("release"), add="+")
        widget.bind("<Double-ButtonPress>", pointer("double"), add="+")
        widget.bind("<KeyPress>", lambda e: self.emit(event="key", widget=name,
                                                      keysym=e.keysym, char=e.char,
                                                      mods=mods(e.state)), add="+")

    def on_motion(self, e):
        if self.drag is not None:
            self.drag["moves"] += 1
            x0, y0 = self.drag.get("last", self.drag["from"])
            self.widgets["canvas"].create_line(x0, y0, e.x, e.y, width=3)
            self.drag["last"] = [e.x, e.y]

    def on_menu(self, e):
        self.menu.tk_popup(e.x_root, e.y_root)
        self.root.after(200, self.menu_shown)

    def menu_shown(self):
        m = self.menu
        m.update_idletasks()
        entries = {}
        for i, item in enumerate(MENU_ITEMS):
            top = m.yposition(i)
            bottom = m.yposition(i + 1) if i + 1 < len(MENU_ITEMS) else m.winfo_height()
            entries[item] = [m.winfo_rootx() + m.winfo_width() // 2,
                             m.winfo_rooty() + (top + bottom) // 2]
        self.emit(event="menu_shown", entries=entries, mapped=bool(m.winfo_ismapped()))

    def on_select(self, _e):
        lb = self.widgets["list"]
        self.emit(event="select", widget="list", items=[lb.get(i) for i in lb.curselection()])

    def on_yview(self, first, last):
        self.emit(event="yview", widget="list", first=round(float(first), 4),
                  last=round(float(last), 4))

    def geometry(self):
        out = {}
        for name, w in self.widgets.items():
            out[name] = [w.winfo_rootx(), w.winfo_rooty(), w.winfo_width(), w.winfo_height()]
        s = self.widgets["scale"]
        ox, oy = s.winfo_rootx(), s.winfo_rooty()
        out["scale_slider"] = {str(v): [ox + s.coords(v)[0], oy + s.coords(v)[1]]
                               for v in (0, 50, 100)}
        lb = self.widgets["list"]
        rows = {}
        for i in range(lb.nearest(0), lb.nearest(lb.winfo_height()) + 1):
            box = lb.bbox(i)
            if box:
                rows[lb.get(i)] = [lb.winfo_rootx() + box[0] + box[2] // 2,
                                   lb.winfo_rooty() + box[1] + box[3] // 2]
        out["list_rows"] = rows
        return out

    def ready(self):
        self.root.update_idletasks()
        self.size = (self.root.winfo_width(), self.root.winfo_height())
        self.emit(event="ready", pid=os.getpid(), window=list(self.size),
                  screen=[self.root.winfo_screenwidth(), self.root.winfo_screenheight()],
                  widgets=self.geometry())

    def on_configure(self, e):
        if e.widget is not self.root or self.size is None:
            return
        size = (e.width, e.height)
        if size != self.size:
            self.size = size
            self.root.after(100, lambda: self.emit(event="layout", window=list(size),
                                                   widgets=self.geometry()))


def mods(state):
    return [name for bit, name in MODS if state & bit]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    App(sys.argv[1]).root.mainloop()
