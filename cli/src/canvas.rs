//! The drawing surface of `plot`: a handful of primitives (rectangles, polygons, lines, text) with
//! two implementations, SVG written as text and PNG rasterised with tiny-skia. The plot is laid out
//! once against the [`Canvas`] trait, so the two formats show the same picture.
//!
//! Text in the PNG is drawn from DejaVu Sans embedded in the binary (through the `dejavu` crate),
//! so a PNG has readable labels on a machine without any fonts installed; the SVG names the same
//! family and lets the viewer fall back to a sans-serif one.

use ab_glyph::{Font, FontRef, PxScale, ScaleFont};
use anyhow::{anyhow, Result};
use std::fmt::Write as _;

/// A colour with opacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rgba(pub u8, pub u8, pub u8, pub u8);

impl Rgba {
    pub const fn rgb(hex: u32) -> Rgba {
        Rgba((hex >> 16) as u8, (hex >> 8) as u8, hex as u8, 255)
    }

    pub const fn alpha(self, a: u8) -> Rgba {
        Rgba(self.0, self.1, self.2, a)
    }

    fn hex(self) -> String {
        format!("#{:02x}{:02x}{:02x}", self.0, self.1, self.2)
    }
}

/// Where a text's `x` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Anchor {
    Start,
    Middle,
    End,
}

/// The embedded fonts, also used to measure text when laying the plot out.
pub struct Fonts {
    regular: FontRef<'static>,
    bold: FontRef<'static>,
}

impl Fonts {
    pub fn load() -> Result<Fonts> {
        let load = |bytes: &'static [u8]| {
            FontRef::try_from_slice(bytes).map_err(|e| anyhow!("the embedded font: {e}"))
        };
        Ok(Fonts {
            regular: load(dejavu::sans::regular())?,
            bold: load(dejavu::sans::bold())?,
        })
    }

    fn font(&self, bold: bool) -> &FontRef<'static> {
        if bold {
            &self.bold
        } else {
            &self.regular
        }
    }

    /// Width in pixels of `text` at `size` (pixels per em).
    pub fn width(&self, text: &str, size: f32, bold: bool) -> f32 {
        let font = self.font(bold).as_scaled(PxScale::from(size));
        let mut width = 0.0;
        let mut previous = None;
        for c in text.chars() {
            let id = font.glyph_id(c);
            if let Some(p) = previous {
                width += font.kern(p, id);
            }
            width += font.h_advance(id);
            previous = Some(id);
        }
        width
    }

    /// `text`, shortened with an ellipsis to fit `max` pixels.
    pub fn fit(&self, text: &str, size: f32, bold: bool, max: f32) -> String {
        if self.width(text, size, bold) <= max {
            return text.to_string();
        }
        let mut chars: Vec<char> = text.chars().collect();
        while !chars.is_empty() {
            chars.pop();
            let candidate: String = chars.iter().collect::<String>() + "…";
            if self.width(&candidate, size, bold) <= max {
                return candidate;
            }
        }
        String::new()
    }
}

/// What a plot is drawn on. Coordinates are pixels from the top-left corner; text `y` is the
/// baseline.
pub trait Canvas {
    fn rect(&mut self, x: f32, y: f32, w: f32, h: f32, fill: Rgba);
    fn polygon(&mut self, points: &[(f32, f32)], fill: Rgba);
    /// A polyline; `dash` is the length of dashes and gaps.
    fn line(&mut self, points: &[(f32, f32)], stroke: Rgba, width: f32, dash: Option<f32>);
    #[allow(clippy::too_many_arguments)]
    fn text(
        &mut self,
        x: f32,
        y: f32,
        text: &str,
        size: f32,
        color: Rgba,
        anchor: Anchor,
        bold: bool,
    );
}

/// An SVG document, built as text.
pub struct Svg {
    body: String,
    width: u32,
    height: u32,
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn points_attr(points: &[(f32, f32)]) -> String {
    let mut s = String::with_capacity(points.len() * 14);
    for (i, (x, y)) in points.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        let _ = write!(s, "{x:.1},{y:.1}");
    }
    s
}

fn opacity(attr: &str, c: Rgba) -> String {
    if c.3 == 255 {
        String::new()
    } else {
        format!(" {attr}=\"{:.3}\"", c.3 as f32 / 255.0)
    }
}

impl Svg {
    pub fn new(width: u32, height: u32) -> Svg {
        Svg {
            body: String::new(),
            width,
            height,
        }
    }

    pub fn finish(self) -> String {
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
             <svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
             viewBox=\"0 0 {w} {h}\" font-family=\"DejaVu Sans, Verdana, Helvetica, Arial, sans-serif\">\n\
             <rect x=\"0\" y=\"0\" width=\"{w}\" height=\"{h}\" fill=\"#ffffff\"/>\n{body}</svg>\n",
            w = self.width,
            h = self.height,
            body = self.body
        )
    }
}

impl Canvas for Svg {
    fn rect(&mut self, x: f32, y: f32, w: f32, h: f32, fill: Rgba) {
        let _ = writeln!(
            self.body,
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{h:.1}\" fill=\"{}\"{}/>",
            fill.hex(),
            opacity("fill-opacity", fill)
        );
    }

    fn polygon(&mut self, points: &[(f32, f32)], fill: Rgba) {
        let _ = writeln!(
            self.body,
            "<polygon points=\"{}\" fill=\"{}\"{}/>",
            points_attr(points),
            fill.hex(),
            opacity("fill-opacity", fill)
        );
    }

    fn line(&mut self, points: &[(f32, f32)], stroke: Rgba, width: f32, dash: Option<f32>) {
        let dash = dash.map_or(String::new(), |d| {
            format!(" stroke-dasharray=\"{d:.1} {d:.1}\"")
        });
        let _ = writeln!(
            self.body,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\"{} stroke-width=\"{width:.1}\" \
             stroke-linejoin=\"round\"{dash}/>",
            points_attr(points),
            stroke.hex(),
            opacity("stroke-opacity", stroke)
        );
    }

    fn text(
        &mut self,
        x: f32,
        y: f32,
        text: &str,
        size: f32,
        color: Rgba,
        anchor: Anchor,
        bold: bool,
    ) {
        let anchor = match anchor {
            Anchor::Start => "start",
            Anchor::Middle => "middle",
            Anchor::End => "end",
        };
        let weight = if bold { " font-weight=\"bold\"" } else { "" };
        let _ = writeln!(
            self.body,
            "<text x=\"{x:.1}\" y=\"{y:.1}\" font-size=\"{size:.1}\" fill=\"{}\"{} \
             text-anchor=\"{anchor}\"{weight}>{}</text>",
            color.hex(),
            opacity("fill-opacity", color),
            escape(text)
        );
    }
}

/// A bitmap, rasterised with anti-aliasing.
pub struct Raster<'f> {
    pixmap: tiny_skia::Pixmap,
    fonts: &'f Fonts,
}

fn paint(c: Rgba) -> tiny_skia::Paint<'static> {
    let mut p = tiny_skia::Paint::default();
    p.set_color_rgba8(c.0, c.1, c.2, c.3);
    p.anti_alias = true;
    p
}

fn path(points: &[(f32, f32)], close: bool) -> Option<tiny_skia::Path> {
    let mut b = tiny_skia::PathBuilder::new();
    let (first, rest) = points.split_first()?;
    b.move_to(first.0, first.1);
    for p in rest {
        b.line_to(p.0, p.1);
    }
    if close {
        b.close();
    }
    b.finish()
}

impl<'f> Raster<'f> {
    pub fn new(width: u32, height: u32, fonts: &'f Fonts) -> Result<Raster<'f>> {
        let mut pixmap = tiny_skia::Pixmap::new(width, height)
            .ok_or_else(|| anyhow!("cannot make a {width}x{height} image"))?;
        pixmap.fill(tiny_skia::Color::WHITE);
        Ok(Raster { pixmap, fonts })
    }

    pub fn png(&self) -> Result<Vec<u8>> {
        self.pixmap
            .encode_png()
            .map_err(|e| anyhow!("encoding the PNG: {e}"))
    }

    /// Blends `color` at coverage `cover` into one pixel (premultiplied alpha, as tiny-skia stores).
    fn blend(&mut self, x: i32, y: i32, color: Rgba, cover: f32) {
        let (w, h) = (self.pixmap.width() as i32, self.pixmap.height() as i32);
        if x < 0 || y < 0 || x >= w || y >= h || cover <= 0.0 {
            return;
        }
        let a = cover.min(1.0) * color.3 as f32 / 255.0;
        let index = (y * w + x) as usize;
        let dst = self.pixmap.pixels_mut()[index];
        let mix = |s: u8, d: u8| (s as f32 * a + d as f32 * (1.0 - a)).round() as u8;
        let out_a = (255.0 * a + dst.alpha() as f32 * (1.0 - a)).round() as u8;
        let r = mix(color.0, dst.red()).min(out_a);
        let g = mix(color.1, dst.green()).min(out_a);
        let b = mix(color.2, dst.blue()).min(out_a);
        if let Some(px) = tiny_skia::PremultipliedColorU8::from_rgba(r, g, b, out_a) {
            self.pixmap.pixels_mut()[index] = px;
        }
    }
}

impl Canvas for Raster<'_> {
    fn rect(&mut self, x: f32, y: f32, w: f32, h: f32, fill: Rgba) {
        if let Some(r) = tiny_skia::Rect::from_xywh(x, y, w, h) {
            self.pixmap
                .fill_rect(r, &paint(fill), tiny_skia::Transform::identity(), None);
        }
    }

    fn polygon(&mut self, points: &[(f32, f32)], fill: Rgba) {
        if let Some(p) = path(points, true) {
            self.pixmap.fill_path(
                &p,
                &paint(fill),
                tiny_skia::FillRule::Winding,
                tiny_skia::Transform::identity(),
                None,
            );
        }
    }

    fn line(&mut self, points: &[(f32, f32)], stroke: Rgba, width: f32, dash: Option<f32>) {
        if let Some(p) = path(points, false) {
            let s = tiny_skia::Stroke {
                width,
                line_join: tiny_skia::LineJoin::Round,
                dash: dash.and_then(|d| tiny_skia::StrokeDash::new(vec![d, d], 0.0)),
                ..tiny_skia::Stroke::default()
            };
            self.pixmap.stroke_path(
                &p,
                &paint(stroke),
                &s,
                tiny_skia::Transform::identity(),
                None,
            );
        }
    }

    fn text(
        &mut self,
        x: f32,
        y: f32,
        text: &str,
        size: f32,
        color: Rgba,
        anchor: Anchor,
        bold: bool,
    ) {
        let fonts = self.fonts;
        let width = fonts.width(text, size, bold);
        let mut pen = match anchor {
            Anchor::Start => x,
            Anchor::Middle => x - width / 2.0,
            Anchor::End => x - width,
        };
        let font = fonts.font(bold);
        let scaled = font.as_scaled(PxScale::from(size));
        let mut previous = None;
        for c in text.chars() {
            let id = scaled.glyph_id(c);
            if let Some(p) = previous {
                pen += scaled.kern(p, id);
            }
            let glyph = id.with_scale_and_position(size, ab_glyph::point(pen, y));
            pen += scaled.h_advance(id);
            previous = Some(id);
            if let Some(outline) = font.outline_glyph(glyph) {
                let bounds = outline.px_bounds();
                let mut covered = Vec::new();
                outline.draw(|gx, gy, cover| covered.push((gx, gy, cover)));
                for (gx, gy, cover) in covered {
                    self.blend(
                        bounds.min.x as i32 + gx as i32,
                        bounds.min.y as i32 + gy as i32,
                        color,
                        cover,
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_escapes_text_and_sets_opacity() {
        let mut s = Svg::new(10, 10);
        s.text(
            1.0,
            2.0,
            "a<b & \"c\"",
            12.0,
            Rgba::rgb(0x112233).alpha(128),
            Anchor::End,
            true,
        );
        let doc = s.finish();
        assert!(doc.contains("a&lt;b &amp; &quot;c&quot;"), "{doc}");
        assert!(
            doc.contains("fill=\"#112233\" fill-opacity=\"0.502\""),
            "{doc}"
        );
        assert!(
            doc.contains("text-anchor=\"end\" font-weight=\"bold\""),
            "{doc}"
        );
    }

    #[test]
    fn raster_text_leaves_ink() {
        let fonts = Fonts::load().unwrap();
        let mut r = Raster::new(60, 20, &fonts).unwrap();
        r.text(2.0, 15.0, "GiB", 14.0, Rgba::rgb(0), Anchor::Start, false);
        let dark = r.pixmap.pixels().iter().filter(|p| p.red() < 128).count();
        assert!(dark > 20, "{dark} dark pixels");
        assert!(fonts.width("GiB", 14.0, false) > 15.0);
        assert_eq!(fonts.fit("abcdef", 14.0, false, 1000.0), "abcdef");
        assert!(fonts.fit("abcdefghijkl", 14.0, false, 40.0).ends_with('…'));
    }
}
